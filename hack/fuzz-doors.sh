#!/usr/bin/env bash
# The doors' fuzzers for longer than CI runs them: the registry's answers and the layer
# headers (tests/image/test_fuzz_doors.py), the conf files and the metrics listener
# (tests/test_doors.py), N examples per door (default 20000; about a minute per
# thousand for the layer headers). Usage: hack/fuzz-doors.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
PYCRI_FUZZ_EXAMPLES=${1:-20000} exec .venv/bin/pytest -q -p no:cacheprovider \
    tests/image/test_fuzz_doors.py tests/test_doors.py -k "not corpus"

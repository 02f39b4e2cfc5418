#!/usr/bin/env bash
# The stored-state fuzzer (tests/store/test_fuzz_rows.py) for longer than CI runs it:
# N mutated databases (default 2000, about half a minute per hundred), a daemon
# started over each. Usage: hack/fuzz-rows.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
PYCRI_FUZZ_ROWS=${1:-2000} exec .venv/bin/pytest -q -p no:cacheprovider \
    tests/store/test_fuzz_rows.py

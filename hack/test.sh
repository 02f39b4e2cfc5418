#!/usr/bin/env bash
# One command from a fresh Debian host to the whole test suite: install what
# the tests need, lint (ruff, mypy, the import layers), then pytest. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh || exit 1

.venv/bin/ruff check pycri tests hack || exit 1
.venv/bin/mypy || exit 1
.venv/bin/lint-imports || exit 1  # the layers in pyproject.toml

# What the run did not cover (a tool no package provides is missing) is said last.
missed=$(mktemp)
trap 'rm -f "$missed"' EXIT
PYCRI_NOT_EXERCISED_FILE=$missed .venv/bin/pytest -ra -p no:cacheprovider "$@"
rc=$?
cat "$missed"
if [ "$rc" = 5 ]; then
    # pytest: no tests collected. With a filter that is the user's choice;
    # for the whole suite it means the suite is broken.
    if [ $# -gt 0 ]; then
        echo "hack/test.sh: no test matched the given arguments" >&2
        exit 0
    fi
    echo "hack/test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"

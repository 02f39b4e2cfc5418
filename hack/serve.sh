#!/usr/bin/env bash
# One command from a fresh Debian host to a running node runtime:
# install what pycri needs, then run `pycri serve` with the embedded defaults
# (socket /run/pycri/pycri.sock). Extra arguments go to `pycri serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
exec .venv/bin/pycri serve "$@"

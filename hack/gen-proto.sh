#!/usr/bin/env bash
# Regenerate the Python stubs of the CRI contract (proto/runtime/v1/api.proto)
# into pycri/api/. tests/test_proto.py fails when the committed stubs are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=${1:-pycri/api}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" \
    --grpc_python_out="$tmp" proto/runtime/v1/api.proto
# protoc names the module after its path (runtime.v1); make the import package-relative.
sed -i 's/^from runtime\.v1 import api_pb2 as /from pycri.api import api_pb2 as /' \
    "$tmp/runtime/v1/api_pb2_grpc.py"
mkdir -p "$out"
cp "$tmp"/runtime/v1/api_pb2.py "$tmp"/runtime/v1/api_pb2.pyi "$tmp"/runtime/v1/api_pb2_grpc.py "$out"/

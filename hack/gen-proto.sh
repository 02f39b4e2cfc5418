#!/usr/bin/env bash
# Regenerate the Python stubs of the wire contracts pycri speaks:
#   the CRI (proto/runtime/v1/api.proto) into pycri/api/, gRPC services included;
#   NRI (proto/nri/api.proto, containerd/nri pkg/api) into pycri/nri/api/, messages
#   only, since NRI runs over ttrpc (pycri/nri/ttrpc.py), not gRPC;
#   the containerd calls cAdvisor makes (proto/cadvisor/containerd.proto) into
#   pycri/cadvisor/api/, messages only (pycri/cadvisor/door.py binds the methods);
#   pycri's own Pulls service (proto/pycri/v1/pulls.proto) into pycri/api/, with its
#   gRPC service (`pycri pulls` and `pycri pull` read it).
# tests/api/test_proto.py fails when the committed stubs are stale.
# Usage: hack/gen-proto.sh [CRI_OUT [NRI_OUT [CADVISOR_OUT]]] (Pulls goes with CRI_OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=${1:-pycri/api}
nri_out=${2:-pycri/nri/api}
cadvisor_out=${3:-pycri/cadvisor/api}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" \
    --grpc_python_out="$tmp" proto/runtime/v1/api.proto
# protoc names the module after its path (runtime.v1); make the import package-relative.
sed -i 's/^from runtime\.v1 import api_pb2 as /from pycri.api import api_pb2 as /' \
    "$tmp/runtime/v1/api_pb2_grpc.py"
mkdir -p "$out"
cp "$tmp"/runtime/v1/api_pb2.py "$tmp"/runtime/v1/api_pb2.pyi "$tmp"/runtime/v1/api_pb2_grpc.py "$out"/
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" \
    --grpc_python_out="$tmp" proto/pycri/v1/pulls.proto
sed -i 's/^from pycri\.v1 import pulls_pb2 as /from pycri.api import pulls_pb2 as /' \
    "$tmp/pycri/v1/pulls_pb2_grpc.py"
cp "$tmp"/pycri/v1/pulls_pb2.py "$tmp"/pycri/v1/pulls_pb2.pyi "$tmp"/pycri/v1/pulls_pb2_grpc.py "$out"/
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" proto/nri/api.proto
mkdir -p "$nri_out"
cp "$tmp"/nri/api_pb2.py "$tmp"/nri/api_pb2.pyi "$nri_out"/
# protoc's stub declares NRI's enum value `None` (Field.None) as an attribute, which is
# not Python syntax and stops mypy reading the stub; it is reachable as Field.Value("None").
sed -i '/^ *None: /d' "$nri_out"/api_pb2.pyi
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" \
    proto/cadvisor/containerd.proto
mkdir -p "$cadvisor_out"
cp "$tmp"/cadvisor/containerd_pb2.py "$tmp"/cadvisor/containerd_pb2.pyi "$cadvisor_out"/

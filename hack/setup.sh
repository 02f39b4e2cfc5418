#!/usr/bin/env bash
# Install everything pycri and its tests need on a Debian (bookworm) host, as root:
# the Debian packages (OCI runtimes, conmon, CNI plugins, test registry...) and
# the Python venv in .venv with pycri installed in editable mode.
# Re-runnable: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    runc crun conmon catatonit containernetworking-plugins iptables iproute2
    libcap-dev gcc python3-venv python3-dev
    docker-registry skopeo busybox-static apache2-utils
)

if [ "$(id -u)" != 0 ]; then
    echo "hack/setup.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "hack/setup.sh: installing ${missing[*]}"
    # Keep Debian's docker-registry service from starting on :5000 while it installs.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
    [ "$made_policy" = 1 ] && rm -f "$policy"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import pycri, grpc_tools, pytest' 2>/dev/null \
    || [ pyproject.toml -nt .venv/.installed ]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[dev]'
    touch .venv/.installed
fi

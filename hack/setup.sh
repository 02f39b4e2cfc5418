#!/usr/bin/env bash
# Install everything pycri and its tests need on a Debian (bookworm) host, as root:
# the Debian packages (OCI runtimes, conmon, CNI plugins, test registry...) and
# the Python venv in .venv with pycri installed in editable mode.
# Re-runnable: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    runc crun conmon catatonit containernetworking-plugins iptables iproute2
    libcap-dev gcc python3-venv python3-dev binutils dpkg-dev
    docker-registry skopeo busybox-static apache2-utils criu
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

# crun 1.8 refuses to run on a hybrid-cgroup host while hugetlb is bound to the
# v2 hierarchy; binding it to v1 (as the critest harness does) makes crun usable.
# `pycri check` reports this state too.
unified=/sys/fs/cgroup/unified/cgroup.controllers
if [ -r "$unified" ] && grep -qw hugetlb "$unified" && ! mountpoint -q /sys/fs/cgroup/hugetlb; then
    echo "hack/setup.sh: binding the hugetlb cgroup controller to v1 so crun can run"
    mkdir -p /sys/fs/cgroup/hugetlb
    mount -t cgroup -o hugetlb none /sys/fs/cgroup/hugetlb || \
        echo "hack/setup.sh: could not bind hugetlb to v1; crun will not run here" >&2
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

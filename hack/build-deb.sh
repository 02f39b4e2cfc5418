#!/usr/bin/env bash
# Build pycri_<version>_<arch>.deb from this tree into OUTDIR (default: dist/).
#
# The package is self-contained: a venv at /usr/lib/pycri on Debian's own python3,
# holding pycri and every Python dependency (python-prctl compiled here), so a node
# needs neither a compiler nor pip. The venv is built in a staging directory and
# relocated (script shebangs rewritten, bytecode compiled with its final paths); the
# build fails if any file still names the staging directory. Plain dpkg-deb, no
# debian/ source package: see docs/architecture.md ("Installing like a runtime").
# Root is needed only to install missing build dependencies.
set -euo pipefail
here=$(dirname "$0")
outdir=$(realpath -m "${1:-$here/../dist}")
cd "$here/.."

PREFIX=/usr/lib/pycri
# The node's python3 runs the venv: never a pyenv or the dev .venv's interpreter.
PY=/usr/bin/python3
BUILD_DEPS=(python3 python3-venv python3-dev libcap-dev gcc binutils dpkg-dev)

missing=()
for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "hack/build-deb.sh: missing build dependencies: ${missing[*]} (run as root to install them)" >&2
        exit 1
    fi
    echo "hack/build-deb.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

version=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' pyproject.toml)
arch=$(dpkg --print-architecture)
read -r pymajor pyminor < <("$PY" -c 'import sys; print(*sys.version_info[:2])')

umask 022
work=$(mktemp -d "${TMPDIR:-/tmp}/pycri-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps expects the tree where debhelper would put it.
pkg=$work/debian/pycri
venv=$pkg$PREFIX

# Build from a copy: pip's build leaves build/ and egg-info behind in its source.
mkdir -p "$work/src"
cp pyproject.toml README.md "$work/src/"
cp -r pycri "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +

"$PY" -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-compile "$work/src"
# The node gets no pip: nothing installs into this venv after the build.
"$venv/bin/python" -m pip uninstall -q -y pip setuptools
rm -f "$venv"/bin/activate* "$venv"/bin/Activate.ps1
# pip records where a local project came from: the staging path, meaningless on a node.
rm -f "$venv"/lib/python3*/site-packages/pycri-*.dist-info/direct_url.json
sed -i "s|$venv|$PREFIX|g" "$venv/pyvenv.cfg"   # its `command` line: how it was made
# Wheels may ship their extensions with debug symbols (zstandard's: 24 MB of 25).
mapfile -t sos < <(find "$venv" -name '*.so*' -type f)
strip --strip-unneeded "${sos[@]}"
for f in "$venv"/bin/*; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then
        sed -i "1s|^#!$venv/bin/|#!$PREFIX/bin/|" "$f"
    fi
done
# Bytecode with its final paths, checked by hash only: Python never rewrites it, so
# nothing but dpkg's files ever lands under /usr/lib/pycri.
"$venv/bin/python" -m compileall -q -j0 --invalidation-mode unchecked-hash -s "$pkg" -p / \
    "$venv/lib"

# The conffile: every key commented out with its default. It shows the defaults, and
# the node runs on those of the version installed.
mkdir -p "$pkg/etc/pycri"
{
    echo "# pycri configuration (read by \`pycri serve\`; \`pycri config\` prints the effective one)."
    echo "# Every key below is commented out and shows its default. Uncomment a key (and its"
    echo "# [table] line) to change it. A node with crun but no runc sets default_runtime = \"crun\"."
    echo "# Keys and what a reload changes: /usr/share/doc/pycri/operating.md.gz"
    echo "#"
    "$venv/bin/python" -m pycri config --config /dev/null | sed -e 's/^\(.\)/# \1/'
} > "$pkg/etc/pycri/pycri.toml"

mkdir -p "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/usr/share/doc/pycri"
ln -s "../lib/pycri/bin/pycri" "$pkg/usr/bin/pycri"
for unit in pycri.service pycri.socket; do
    sed -e "s|^ExecStart=/opt/pycri/bin/pycri |ExecStart=/usr/bin/pycri |" \
        -e '/^# Install: docs\/operating.md/,/^# installed in a venv at \/opt\/pycri/c\
# Installed by the pycri package (docs/operating.md, "The systemd unit").' \
        "contrib/systemd/$unit" > "$pkg/lib/systemd/system/$unit"
done
if grep -q /opt/pycri "$pkg/lib/systemd/system/"*; then
    echo "hack/build-deb.sh: the unit still names /opt/pycri; update the rewrite above" >&2
    exit 1
fi
gzip -9n -c docs/operating.md > "$pkg/usr/share/doc/pycri/operating.md.gz"
cat > "$pkg/usr/share/doc/pycri/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pycri
Comment: /usr/lib/pycri also holds pycri's Python dependencies, each under its
 own license (see their *.dist-info directories there).

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
COPYRIGHT

if grep -rlF "$work" "$pkg"; then
    echo "hack/build-deb.sh: the files above still name the staging directory $work" >&2
    exit 1
fi

# The shared libraries the compiled extensions link (libc6, libcap2 for prctl, ...).
mkdir -p "$pkg/DEBIAN"
printf 'Source: pycri\n\nPackage: pycri\nArchitecture: any\n' > "$work/debian/control"
shlibs=$(cd "$work" && dpkg-shlibdeps -O --warnings=0 "${sos[@]#"$work/"}" \
    | sed -n 's/^shlibs:Depends=//p')

case "$shlibs" in *libcap2*) ;; *)
    echo "hack/build-deb.sh: no libcap2 in the computed dependencies ($shlibs): was prctl built?" >&2
    exit 1
esac

for script in postinst prerm postrm; do
    install -m 0755 "contrib/debian/$script" "$pkg/DEBIAN/$script"
done
echo /etc/pycri/pycri.toml > "$pkg/DEBIAN/conffiles"
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: pycri
Version: $version
Architecture: $arch
Maintainer: ${DEBFULLNAME:-pycri developers} <${DEBEMAIL:-pycri@localhost}>
Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
Depends: runc | crun, conmon, catatonit, containernetworking-plugins, iptables,
 python3 (>= $pymajor.$pyminor), python3 (<< $pymajor.$((pyminor + 1))), $shlibs
Suggests: criu
Section: admin
Priority: optional
Description: Kubernetes CRI container runtime written in Python
 pycri serves the Kubernetes Container Runtime Interface on a unix socket,
 running pods and containers with runc or crun under conmon. Its Python
 dependencies are bundled in /usr/lib/pycri, a venv on Debian's python3.
CONTROL

mkdir -p "$outdir"
deb=$outdir/pycri_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zzstd -b "$pkg" "$deb" >/dev/null
echo "$deb"

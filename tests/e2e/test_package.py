"""The Debian package from hack/build-deb.sh, installed with apt on this machine: the
installed /usr/bin/pycri runs a pod, an upgrade with the pod running leaves it to the
next daemon, and remove then purge leave nothing of the package behind.

The package is built once (about 30 s here; a minute on a cold pip cache). The upgrade
installs the same build repacked as version `<version>+test`: dpkg then runs the whole
upgrade path (prerm upgrade, unpack over the old files, postinst configure) as for a
real new version, and a second venv build would only add a minute.

The installed daemon runs on this test's own socket, root and state, never through
systemd (this machine may not run it): under systemd the prerm stops the service
before an upgrade or a remove and KillMode=process keeps the monitors; here the test
sends that same SIGTERM to the daemon alone. policy-rc.d keeps the maintainer scripts
from starting the packaged service where systemd does run. Whole test: about 2 min.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from tests.conftest import REPO, PycriProcess
from tests.e2e.conftest import Node, leftovers, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.deb]

BUILD_TIMEOUT = 600
APT_TIMEOUT = 300
POLICY = Path("/usr/sbin/policy-rc.d")
# What the package owns on the node, and the default dirs its purge removes.
INSTALLED = (Path("/usr/lib/pycri"), Path("/usr/bin/pycri"),
             Path("/lib/systemd/system/pycri.service"), Path("/lib/systemd/system/pycri.socket"))
DEFAULT_DIRS = (Path("/etc/pycri"), Path("/var/lib/pycri"), Path("/run/pycri"))
# What deb-systemd-helper makes for the units (enable link, its state, the mask).
SYSTEMD_LEFTOVERS = (Path("/etc/systemd/system/multi-user.target.wants/pycri.service"),
                     Path("/etc/systemd/system/pycri.service"),
                     Path("/etc/systemd/system/pycri.socket"),
                     Path("/var/lib/systemd/deb-systemd-helper-enabled/pycri.service.dsh-also"),
                     Path("/var/lib/systemd/deb-systemd-helper-masked/pycri.service"))


def _clean_env() -> dict[str, str]:
    """Our environment minus what would put the checkout on the installed pycri's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@dataclass
class InstalledPycri(PycriProcess):
    """`/usr/bin/pycri serve` from the package, on the test's own dirs."""

    env: dict[str, str] | None = field(default_factory=_clean_env)

    def argv(self) -> list[str]:
        return ["/usr/bin/pycri", *super().argv()[3:]]


def _run(*argv: str | Path, timeout: float = APT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run from / so that `python -c` finds no pycri in its working directory."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd="/",
                          timeout=timeout, env=_clean_env() | {"DEBIAN_FRONTEND": "noninteractive"})


def _apt(*args: str | Path) -> str:
    """apt-get, waiting for the dpkg lock another apt may hold; returns its output."""
    res = _run("apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def _status() -> str:
    """dpkg's status of pycri ('' when dpkg knows nothing of it)."""
    return _run("dpkg-query", "-W", "-f=${Status} ${Version}", "pycri").stdout


def _skip_unless_ours() -> None:
    """Skip where the package's install or purge would hit a pycri this test did not make."""
    if _status():
        pytest.skip(f"pycri is installed here ({_status()}): the test would replace it")
    if present := [str(d) for d in DEFAULT_DIRS if d.exists()]:
        pytest.skip(f"{', '.join(present)} exist here: purging the package would remove them")


@dataclass(frozen=True)
class Debs:
    first: Path
    upgrade: Path
    version: str


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> Debs:
    """The package built from this tree, and the same build repacked as `<version>+test`."""
    for tool in ("dpkg-deb", "apt-get", "dpkg-shlibdeps"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: no Debian packaging here")
    _skip_unless_ours()  # before the build, which takes a while
    out = tmp_path_factory.mktemp("debs")
    build = _run(REPO / "hack" / "build-deb.sh", out / "first", timeout=BUILD_TIMEOUT)
    assert build.returncode == 0, build.stdout + build.stderr
    first = Path(build.stdout.strip().splitlines()[-1])
    version = _run("dpkg-deb", "-f", first, "Version").stdout.strip()
    tree = out / "tree"
    assert _run("dpkg-deb", "-R", first, tree).returncode == 0
    control = tree / "DEBIAN" / "control"
    text = control.read_text()
    assert f"\nVersion: {version}\n" in text
    control.write_text(text.replace(f"\nVersion: {version}\n", f"\nVersion: {version}+test\n"))
    upgrade = out / f"pycri_{version}+test.deb"
    repack = _run("dpkg-deb", "--root-owner-group", "-Zzstd", "-b", tree, upgrade)
    assert repack.returncode == 0, repack.stderr
    return Debs(first, upgrade, version)


@pytest.fixture
def apt_machine() -> Iterator[None]:
    """This machine, ready for the package to come and go: purged at the end whatever
    happens; skipped where a pycri of its own would be replaced or purged."""
    _skip_unless_ours()
    made_policy = False
    if POLICY.exists():
        said = subprocess.run([POLICY, "pycri.service", "start"], capture_output=True).returncode
        if said != 101:
            pytest.skip(f"{POLICY} allows starting services ({said}); the test would start one")
    else:
        # Services do not start while the package comes and goes (deb-systemd-invoke obeys).
        POLICY.write_text("#!/bin/sh\nexit 101\n")
        POLICY.chmod(0o755)
        made_policy = True
    try:
        yield
    finally:
        try:
            if _status():
                _apt("purge", "pycri")
        finally:
            if made_policy:
                POLICY.unlink()


def _purge_script(deb: Path, tmp: Path, root: Path, state: Path, conf: Path) -> Path:
    """The package's postrm with its default dirs pointed at a test node's (the only
    change): its purge runs against the node's pods without touching this machine's."""
    tmp.mkdir()
    control = tmp / "control"
    assert _run("dpkg-deb", "-e", deb, control).returncode == 0
    text = (control / "postrm").read_text()
    for line, dest in (("ROOT=/var/lib/pycri", root), ("STATE=/run/pycri", state),
                       ("CONF=/etc/pycri", conf)):
        assert text.count(f"\n{line}\n") == 1, line
        text = text.replace(f"\n{line}\n", f"\n{line.split('=')[0]}={dest}\n")
    script = tmp / "postrm"
    script.write_text(text)
    script.chmod(0o755)
    return script


def _container_pid(node: Node, cid: str) -> int:
    return int((node.tmp / "state" / "bundles" / cid / "monitor" / "pidfile").read_text())


def test_package_installs_upgrades_with_a_pod_running_and_purges(
    debs: Debs, apt_machine: None, tmp_path: Path, busybox: str
) -> None:
    # Install: apt checks the Depends (all installed by hack/setup.sh, no network).
    _apt("install", debs.first)
    assert _status() == f"install ok installed {debs.version}"
    depends = _run("dpkg-deb", "-f", debs.first, "Depends").stdout
    for dep in ("runc | crun", "conmon", "catatonit", "containernetworking-plugins",
                "iptables", "python3 (>= 3.", "python3 (<< 3.", "libcap2"):
        assert dep in depends, depends
    # The venv runs on the node's python3 package; it has no pip and no compiler use.
    assert os.path.realpath("/usr/lib/pycri/bin/python3").startswith("/usr/bin/python3")
    where = _run("/usr/lib/pycri/bin/python3", "-c", "import pycri, prctl; print(pycri.__file__)")
    assert where.stdout.startswith("/usr/lib/pycri/lib/"), where.stdout + where.stderr
    assert _run("/usr/lib/pycri/bin/python3", "-m", "pip", "--version").returncode != 0
    # The conffile documents every default and changes none.
    conffiles = _run("dpkg-query", "-W", "-f=${Conffiles}", "pycri").stdout
    assert "/etc/pycri/pycri.toml" in conffiles, conffiles
    assert tomllib.loads(Path("/etc/pycri/pycri.toml").read_text()) == {}
    defaults = _run("/usr/bin/pycri", "config", "--config", "/dev/null").stdout
    assert _run("/usr/bin/pycri", "config").stdout == defaults
    assert "# [runtimes.runc]" in Path("/etc/pycri/pycri.toml").read_text()
    unit = Path("/lib/systemd/system/pycri.service").read_text()
    assert "\nExecStart=/usr/bin/pycri serve\n" in unit and "\nKillMode=process\n" in unit

    with running_node(tmp_path, busybox, InstalledPycri) as node:
        sid, pod = node.run_pod("packaged")
        cid = node.run(sid, pod, "sleeper", ["sleep", "3600"])
        pid = _container_pid(node, cid)
        started = node.status(cid).started_at

        # Upgrade with the pod running: the daemon stops alone (as prerm's stop does
        # under systemd), dpkg replaces its files, the new daemon adopts the pod.
        node.cri.channel.close()
        assert node.proc.stop() == 0, node.proc.log_text()
        _apt("install", debs.upgrade)
        assert _status() == f"install ok installed {debs.version}+test"
        assert Path(f"/proc/{pid}").exists()
        node.start()
        status = node.status(cid)
        assert (status.state, status.started_at) == (pb.CONTAINER_RUNNING, started)
        assert _container_pid(node, cid) == pid
        assert node.exec(cid, "echo", "adopted").stdout == b"adopted\n"

        # Remove: the package goes, the pod and its state stay.
        node.cri.channel.close()
        assert node.proc.stop() == 0, node.proc.log_text()
        _apt("remove", "pycri")
        assert _status().startswith("deinstall ok config-files"), _status()
        # The unit file went; the mask keeps its enable link from pointing at nothing.
        assert os.readlink("/etc/systemd/system/pycri.service") == "/dev/null"
        assert not any(p.exists() or p.is_symlink() for p in INSTALLED)
        assert Path("/etc/pycri/pycri.toml").exists()
        assert Path(f"/proc/{pid}").exists()
        assert leftovers(node.tmp, {sid, cid})["conmon"]

        # Purge with a pod left refuses to delete the node's dirs, and says why (run by
        # hand, the script's deb-systemd-helper calls refuse to act outside dpkg).
        conf = tmp_path / "etc-pycri"
        conf.mkdir()
        (conf / "pycri.toml").write_text("")
        purge = _purge_script(debs.upgrade, tmp_path / "purge", node.proc.root,
                              node.proc.state, conf)
        refused = _run(purge, "purge")
        assert refused.returncode == 0, refused.stderr
        assert "pods are left" in refused.stderr and "conmon running" in refused.stderr, (
            refused.stderr)
        assert node.proc.root.is_dir() and node.proc.state.is_dir() and conf.is_dir()

        # What that message says: install again, remove the pods through pycri; the
        # node's exit checks nothing of them is left.
        _apt("install", debs.upgrade)
        node.start()
        assert node.status(cid).state == pb.CONTAINER_RUNNING
        node.remove_all()

    # No pod left: the same purge removes the dirs.
    done = _run(purge, "purge")
    assert done.returncode == 0 and "pods are left" not in done.stderr, done.stderr
    assert not any(p.exists() for p in (node.proc.root, node.proc.state, conf))

    _apt("remove", "pycri")
    _apt("purge", "pycri")
    assert _status() == ""
    left = [p for p in (*INSTALLED, *DEFAULT_DIRS, *SYSTEMD_LEFTOVERS)
            if p.exists() or p.is_symlink()]
    assert left == [], left

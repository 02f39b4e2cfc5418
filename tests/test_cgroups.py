"""Where pycri looks for a container's cgroup, from the cgroupsPath it gave the runtime."""

from __future__ import annotations

from pathlib import Path

from pycri.stats.cgroups import Usage, read_usage, relative_dir


def test_systemd_and_cgroupfs_paths() -> None:
    assert relative_dir("system.slice:pycri:abc") == "system.slice/pycri-abc.scope"
    assert relative_dir("a-b.slice:pycri:abc") == "a.slice/a-b.slice/pycri-abc.scope"
    assert relative_dir("/pycri/pycri-abc") == "pycri/pycri-abc"


def test_cgroupfs_parent_with_a_colon(tmp_path: Path) -> None:
    """Found by the fuzzer: a pod whose cgroup_parent held ':' made every stats RPC
    (ListPodSandboxStats, ListContainerStats, ListPodSandboxMetrics) INTERNAL."""
    assert relative_dir("/a:b/pycri-abc") == "a:b/pycri-abc"
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert read_usage("/a:b/pycri-abc", root=tmp_path) == Usage()

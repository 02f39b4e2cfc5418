"""NRI adjustments and updates: merging in plugin order, conflicts, and the OCI spec they
produce, on the spec pycri's own generator builds (pure functions, no host)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.nri.api import api_pb2 as api
from pycri.nri.apply import apply_adjustment
from pycri.nri.checks import AdjustmentConflict, AdjustmentError
from pycri.nri.merge import merge_adjustments, merge_updates, take_update
from pycri.nri.resources import to_cri_resources
from tests.oci.specutil import build, mount_at

MiB = 1024 * 1024


def spec() -> dict[str, Any]:
    return build()


def one(adj: api.ContainerAdjustment, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The spec after a single plugin's adjustment."""
    return apply_adjustment(doc or spec(), merge_adjustments([("p", adj)]))


def env_of(doc: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in doc["process"]["env"])


def i64(v: int) -> api.OptionalInt64:
    return api.OptionalInt64(value=v)


def u64(v: int) -> api.OptionalUInt64:
    return api.OptionalUInt64(value=v)


# ---------------------------------------------------------------- each kind


def test_apply_is_pure() -> None:
    doc = spec()
    before = copy.deepcopy(doc)
    adj = api.ContainerAdjustment(env=[api.KeyValue(key="X", value="1")])
    adj.annotations["a"] = "b"
    out = apply_adjustment(doc, merge_adjustments([("p", adj)]))
    assert doc == before
    assert out != before


def test_empty_adjustment_changes_nothing() -> None:
    assert apply_adjustment(spec(), merge_adjustments([])) == spec()
    assert one(api.ContainerAdjustment()) == spec()


def test_annotations_add_replace_remove() -> None:
    doc = spec()
    doc["annotations"]["keep"] = "1"
    doc["annotations"]["drop"] = "1"
    adj = api.ContainerAdjustment()
    adj.annotations["new"] = "v"
    adj.annotations["keep"] = "2"
    adj.annotations["-drop"] = ""
    out = one(adj, doc)["annotations"]
    assert out["new"] == "v" and out["keep"] == "2" and "drop" not in out
    assert "-drop" not in out


def test_env_add_replace_in_place_and_remove() -> None:
    doc = spec()
    names = list(env_of(doc))
    assert names[:2] == ["PATH", "HOSTNAME"]
    adj = api.ContainerAdjustment(env=[
        api.KeyValue(key="HOSTNAME", value="nri"),
        api.KeyValue(key="-A"),
        api.KeyValue(key="NEW", value="x=y"),
    ])
    out = one(adj, doc)
    env = env_of(out)
    assert env["HOSTNAME"] == "nri" and env["NEW"] == "x=y" and "A" not in env
    assert list(env).index("HOSTNAME") == 1  # replaced where it was
    assert list(env)[-1] == "NEW"


def test_args_replace() -> None:
    out = one(api.ContainerAdjustment(args=["/bin/sh", "-c", "true"]))
    assert out["process"]["args"] == ["/bin/sh", "-c", "true"]


def test_mount_add_replace_remove_and_order() -> None:
    adj = api.ContainerAdjustment(mounts=[
        api.Mount(destination="/data/sub", type="bind", source="/host/sub",
                  options=["rbind", "ro"]),
        api.Mount(destination="/data", type="bind", source="/host/data", options=["rbind"]),
        api.Mount(destination="/etc/hosts", type="bind", source="/other/hosts",
                  options=["rbind", "ro"]),
        api.Mount(destination="-/dev/mqueue"),
    ])
    out = one(adj)
    dests = [m["destination"] for m in out["mounts"]]
    assert "/dev/mqueue" not in dests
    assert dests.index("/data") < dests.index("/data/sub")
    assert mount_at(out, "/etc/hosts")["source"] == "/other/hosts"
    assert mount_at(out, "/data") == {"destination": "/data", "type": "bind",
                                      "source": "/host/data", "options": ["rbind"]}
    assert "rootfsPropagation" not in out["linux"]


def test_mount_propagation_sets_rootfs_propagation() -> None:
    adj = api.ContainerAdjustment(mounts=[
        api.Mount(destination="/a", type="bind", source="/h/a", options=["rbind", "rslave"]),
    ])
    assert one(adj)["linux"]["rootfsPropagation"] == "rslave"
    adj.mounts.append(api.Mount(destination="/b", type="bind", source="/h/b",
                                options=["rbind", "rshared"]))
    assert one(adj)["linux"]["rootfsPropagation"] == "rshared"


def test_hooks_appended_in_plugin_order() -> None:
    a = api.ContainerAdjustment()
    a.hooks.prestart.append(api.Hook(path="/bin/a", args=["a", "1"]))
    a.hooks.create_runtime.append(api.Hook(path="/bin/ca", env=["E=1"],
                                           timeout=api.OptionalInt(value=5)))
    b = api.ContainerAdjustment()
    b.hooks.prestart.append(api.Hook(path="/bin/b"))
    b.hooks.poststop.append(api.Hook(path="/bin/stop"))
    out = apply_adjustment(spec(), merge_adjustments([("a", a), ("b", b)]))
    hooks = out["hooks"]
    assert hooks["prestart"] == [{"path": "/bin/a", "args": ["a", "1"]}, {"path": "/bin/b"}]
    assert hooks["createRuntime"] == [{"path": "/bin/ca", "env": ["E=1"], "timeout": 5}]
    assert hooks["poststop"] == [{"path": "/bin/stop"}]


def test_devices_add_with_cgroup_rule_and_remove() -> None:
    doc = spec()
    adj = api.ContainerAdjustment()
    adj.linux.devices.append(api.LinuxDevice(path="/dev/xnull", type="c", major=1, minor=3,
                                             file_mode=api.OptionalFileMode(value=0o640),
                                             uid=api.OptionalUInt32(value=7)))
    out = one(adj, doc)
    assert out["linux"]["devices"][-1] == {"path": "/dev/xnull", "type": "c", "major": 1,
                                           "minor": 3, "fileMode": 0o640, "uid": 7}
    rule = out["linux"]["resources"]["devices"][-1]
    assert rule == {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
    # a second container's plugin removes it again: node and rule go
    rm = api.ContainerAdjustment()
    rm.linux.devices.append(api.LinuxDevice(path="-/dev/xnull"))
    again = one(rm, out)
    assert all(d["path"] != "/dev/xnull" for d in again["linux"]["devices"])
    assert again["linux"]["resources"]["devices"] == doc["linux"]["resources"]["devices"]


def test_device_access_follows_file_mode() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.devices.append(api.LinuxDevice(path="/dev/ro", type="b", major=8, minor=0,
                                             file_mode=api.OptionalFileMode(value=0o444)))
    assert one(adj)["linux"]["resources"]["devices"][-1]["access"] == "rm"


def test_cdi_devices_need_a_resolver() -> None:
    adj = api.ContainerAdjustment(CDI_devices=[api.CDIDevice(name="vendor.com/gpu=0"),
                                               api.CDIDevice(name="vendor.com/gpu=1")])
    merged = merge_adjustments([("p", adj)])
    with pytest.raises(AdjustmentError, match=r"vendor.com/gpu=0, vendor.com/gpu=1"):
        apply_adjustment(spec(), merged)
    seen: list[list[str]] = []

    def resolve(doc: dict[str, Any], names: list[str]) -> dict[str, Any]:
        seen.append(names)
        return {**doc, "annotations": {**doc["annotations"], "cdi": ",".join(names)}}

    out = apply_adjustment(spec(), merged, cdi=resolve)
    assert seen == [["vendor.com/gpu=0", "vendor.com/gpu=1"]]
    assert out["annotations"]["cdi"] == "vendor.com/gpu=0,vendor.com/gpu=1"


def test_rlimits_replace_by_type() -> None:
    doc = spec()
    doc["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 4096},
                                 {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}]
    adj = api.ContainerAdjustment(rlimits=[
        api.POSIXRlimit(type="RLIMIT_NOFILE", soft=333, hard=444),
        api.POSIXRlimit(type="RLIMIT_NPROC", soft=10, hard=20),
    ])
    limits = {r["type"]: r for r in one(adj, doc)["process"]["rlimits"]}
    assert limits == {
        "RLIMIT_NOFILE": {"type": "RLIMIT_NOFILE", "soft": 333, "hard": 444},
        "RLIMIT_CORE": {"type": "RLIMIT_CORE", "soft": 0, "hard": 0},
        "RLIMIT_NPROC": {"type": "RLIMIT_NPROC", "soft": 10, "hard": 20},
    }


def test_resources_cpu_memory_pids_hugepages_unified() -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="ctr"),
                             image=pb.ImageSpec(image="busybox"))
    cfg.linux.resources.cpu_shares = 512
    cfg.linux.resources.cpu_period = 100000
    cfg.linux.resources.hugepage_limits.append(pb.HugepageLimit(page_size="1GB", limit=0))
    doc = build(cfg)
    adj = api.ContainerAdjustment()
    r = adj.linux.resources
    r.cpu.quota.value = 50000
    r.cpu.cpus = "0"
    r.cpu.mems = "0"
    r.cpu.realtime_runtime.value = 1000
    r.memory.limit.value = 64 * MiB
    r.memory.reservation.value = 32 * MiB
    r.memory.swappiness.value = 10
    r.pids.limit = 100
    r.hugepage_limits.append(api.HugepageLimit(page_size="2MB", limit=4 * MiB))
    r.unified["memory.high"] = "max"
    res = one(adj, doc)["linux"]["resources"]
    assert res["cpu"] == {"shares": 512, "period": 100000, "quota": 50000, "cpus": "0",
                          "mems": "0", "realtimeRuntime": 1000}
    # As NRI does: a new memory limit without a swap limit leaves no swap.
    assert res["memory"] == {"limit": 64 * MiB, "swap": 64 * MiB, "reservation": 32 * MiB,
                             "swappiness": 10}
    assert res["pids"] == {"limit": 100}
    assert res["hugepageLimits"] == [{"pageSize": "1GB", "limit": 0},
                                     {"pageSize": "2MB", "limit": 4 * MiB}]
    assert res["unified"] == {"memory.high": "max"}
    assert res["devices"] == doc["linux"]["resources"]["devices"]


def test_explicit_swap_is_kept() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.resources.memory.limit.value = 64 * MiB
    adj.linux.resources.memory.swap.value = 128 * MiB
    assert one(adj)["linux"]["resources"]["memory"] == {"limit": 64 * MiB, "swap": 128 * MiB}


def test_rdt_class_and_rdt() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.resources.rdt_class.value = "gold"
    assert one(adj)["linux"]["intelRdt"] == {"closID": "gold"}
    rdt = api.ContainerAdjustment()
    rdt.linux.rdt.schemata.value.extend(["L3:0=f"])
    rdt.linux.rdt.enable_monitoring.value = True
    out = one(rdt, one(adj))
    assert out["linux"]["intelRdt"] == {"closID": "gold", "schemata": ["L3:0=f"],
                                        "enableMonitoring": True}
    rm = api.ContainerAdjustment()
    rm.linux.rdt.remove = True
    assert "intelRdt" not in one(rm, out)["linux"]


def test_blockio_class_is_refused_clearly() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.resources.blockio_class.value = "slow"
    with pytest.raises(AdjustmentError, match=r'"p": block I/O class .slow.'):
        merge_adjustments([("p", adj)])


def test_cgroups_path_oom_ioprio_scheduler() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.cgroups_path = "/nri/elsewhere"
    adj.linux.oom_score_adj.value = 500
    setattr(adj.linux.io_priority, "class", api.IOPRIO_CLASS_BE)  # "class" is a Python keyword
    adj.linux.io_priority.priority = 4
    adj.linux.scheduler.policy = api.SCHED_BATCH
    adj.linux.scheduler.nice = 5
    adj.linux.scheduler.flags.append(api.SCHED_FLAG_RESET_ON_FORK)
    out = one(adj)
    assert out["linux"]["cgroupsPath"] == "/nri/elsewhere"
    assert out["process"]["oomScoreAdj"] == 500
    assert out["process"]["ioPriority"] == {"class": "IOPRIO_CLASS_BE", "priority": 4}
    assert out["process"]["scheduler"] == {"policy": "SCHED_BATCH", "nice": 5,
                                           "flags": ["SCHED_FLAG_RESET_ON_FORK"]}


def test_systemd_cgroups_path_accepted() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.cgroups_path = "kubepods.slice:nri:abc"
    assert one(adj)["linux"]["cgroupsPath"] == "kubepods.slice:nri:abc"


def test_seccomp_policy_replaces_profile() -> None:
    adj = api.ContainerAdjustment()
    s = adj.linux.seccomp_policy
    s.default_action = "SCMP_ACT_ALLOW"
    s.architectures.append("SCMP_ARCH_X86_64")
    s.syscalls.append(api.LinuxSyscall(
        names=["mkdir"], action="SCMP_ACT_ERRNO", errno_ret=api.OptionalUInt32(value=1),
        args=[api.LinuxSeccompArg(index=1, value=2, op="SCMP_CMP_EQ")]))
    assert one(adj)["linux"]["seccomp"] == {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
                      "args": [{"index": 1, "value": 2, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]}],
    }


def test_namespaces_add_replace_remove() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.namespaces.extend([
        api.LinuxNamespace(type="network", path="/run/netns/other"),
        api.LinuxNamespace(type="cgroup"),
        api.LinuxNamespace(type="-ipc"),
    ])
    ns = {n["type"]: n for n in one(adj)["linux"]["namespaces"]}
    assert ns["network"] == {"type": "network", "path": "/run/netns/other"}
    assert ns["cgroup"] == {"type": "cgroup"}
    assert "ipc" not in ns and "mount" in ns


def test_sysctl_add_and_remove() -> None:
    adj = api.ContainerAdjustment()
    adj.linux.sysctl["net.ipv4.ping_group_range"] = "0 0"
    adj.linux.sysctl["-net.ipv4.ip_unprivileged_port_start"] = ""
    assert one(adj)["linux"]["sysctl"] == {"net.ipv4.ping_group_range": "0 0"}


# ---------------------------------------------------------------- merging and ownership


def test_plugins_merge_in_order() -> None:
    a = api.ContainerAdjustment(env=[api.KeyValue(key="A", value="1")])
    a.annotations["from"] = "a"
    b = api.ContainerAdjustment(env=[api.KeyValue(key="B", value="2")])
    b.linux.resources.memory.limit.value = 100 * MiB
    merged = merge_adjustments([("a", a), ("b", b)])
    assert [(e.key, e.value) for e in merged.env] == [("A", "1"), ("B", "2")]
    assert dict(merged.annotations) == {"from": "a"}
    assert merged.linux.resources.memory.limit.value == 100 * MiB


@pytest.mark.parametrize("kind,setup", [
    ("Env 'X'", lambda a: a.env.append(api.KeyValue(key="X", value="v"))),
    ("Annotations 'k'", lambda a: a.annotations.__setitem__("k", "v")),
    ("Mounts '/m'", lambda a: a.mounts.append(api.Mount(destination="/m", type="tmpfs"))),
    ("Devices '/dev/d'", lambda a: a.linux.devices.append(
        api.LinuxDevice(path="/dev/d", type="c", major=1, minor=1))),
    ("Rlimits 'RLIMIT_NOFILE'", lambda a: a.rlimits.append(
        api.POSIXRlimit(type="RLIMIT_NOFILE", soft=1, hard=1))),
    ("CdiDevices 'v.com/x=1'", lambda a: a.CDI_devices.append(api.CDIDevice(name="v.com/x=1"))),
    ("Args", lambda a: a.args.extend(["/bin/true"])),
    ("MemLimit", lambda a: a.linux.resources.memory.limit.CopyFrom(i64(64 * MiB))),
    ("CPUShares", lambda a: a.linux.resources.cpu.shares.CopyFrom(u64(100))),
    ("CPUSetCPUs", lambda a: setattr(a.linux.resources.cpu, "cpus", "0")),
    ("PidsLimit", lambda a: setattr(a.linux.resources.pids, "limit", 5)),
    ("HugepageLimits '2MB'", lambda a: a.linux.resources.hugepage_limits.append(
        api.HugepageLimit(page_size="2MB", limit=1))),
    ("CgroupsUnified 'memory.high'", lambda a: a.linux.resources.unified.__setitem__(
        "memory.high", "1")),
    ("RdtClass", lambda a: a.linux.resources.rdt_class.CopyFrom(api.OptionalString(value="x"))),
    ("CgroupsPath", lambda a: setattr(a.linux, "cgroups_path", "/x")),
    ("OomScoreAdj", lambda a: a.linux.oom_score_adj.CopyFrom(api.OptionalInt(value=1))),
    ("SeccompPolicy", lambda a: setattr(a.linux.seccomp_policy, "default_action", "SCMP_ACT_LOG")),
    ("LinuxSched", lambda a: setattr(a.linux.scheduler, "policy", api.SCHED_OTHER)),
    ("IoPriority", lambda a: setattr(a.linux.io_priority, "priority", 1)),
    ("Namespace 'cgroup'", lambda a: a.linux.namespaces.append(api.LinuxNamespace(type="cgroup"))),
    ("Sysctl 'kernel.x'", lambda a: a.linux.sysctl.__setitem__("kernel.x", "1")),
])
def test_two_plugins_setting_one_field_conflict(kind: str, setup: Any) -> None:
    first, second = api.ContainerAdjustment(), api.ContainerAdjustment()
    setup(first)
    setup(second)
    with pytest.raises(AdjustmentConflict) as exc:
        merge_adjustments([("10-first", first), ("20-second", second)])
    msg = str(exc.value)
    assert '"20-second"' in msg and '"10-first"' in msg and kind in msg
    assert exc.value.plugins == ("10-first", "20-second")
    # Either one alone is fine.
    merge_adjustments([("10-first", first)])


def test_different_keys_do_not_conflict() -> None:
    a = api.ContainerAdjustment(env=[api.KeyValue(key="A", value="1")])
    b = api.ContainerAdjustment(env=[api.KeyValue(key="B", value="1")])
    a.linux.resources.memory.limit.value = 64 * MiB
    b.linux.resources.cpu.shares.value = 100
    merged = merge_adjustments([("a", a), ("b", b)])
    assert len(merged.env) == 2


def test_removal_takes_back_an_earlier_plugins_addition() -> None:
    a = api.ContainerAdjustment(env=[api.KeyValue(key="X", value="a")],
                                mounts=[api.Mount(destination="/m", type="tmpfs")])
    a.annotations["k"] = "a"
    b = api.ContainerAdjustment(env=[api.KeyValue(key="-X")], mounts=[api.Mount(destination="-/m")])
    b.annotations["-k"] = ""
    merged = merge_adjustments([("a", a), ("b", b)])
    assert [e.key for e in merged.env] == ["-X"]
    assert [m.destination for m in merged.mounts] == ["-/m"]
    assert dict(merged.annotations) == {"-k": ""}
    out = apply_adjustment(spec(), merged)
    assert "X" not in env_of(out) and "k" not in out["annotations"]
    assert all(m["destination"] != "/m" for m in out["mounts"])


def test_setting_what_another_plugin_removed_is_a_conflict() -> None:
    a = api.ContainerAdjustment(env=[api.KeyValue(key="-X")])
    b = api.ContainerAdjustment(env=[api.KeyValue(key="X", value="b")])
    with pytest.raises(AdjustmentConflict, match=r'"b" and "a" both tried to set Env .X.'):
        merge_adjustments([("a", a), ("b", b)])


def test_a_plugin_may_remove_and_set_the_same_key() -> None:
    a = api.ContainerAdjustment(env=[api.KeyValue(key="-HOSTNAME"),
                                     api.KeyValue(key="HOSTNAME", value="mine")])
    merged = merge_adjustments([("a", a)])
    assert [(e.key, e.value) for e in merged.env] == [("HOSTNAME", "mine")]
    assert env_of(apply_adjustment(spec(), merged))["HOSTNAME"] == "mine"


def test_args_with_empty_first_element_override_without_conflict() -> None:
    a = api.ContainerAdjustment(args=["/bin/a"])
    b = api.ContainerAdjustment(args=["", "/bin/b", "x"])
    merged = merge_adjustments([("a", a), ("b", b)])
    assert list(merged.args) == ["/bin/b", "x"]
    assert apply_adjustment(spec(), merged)["process"]["args"] == ["/bin/b", "x"]


def test_rdt_remove_then_later_plugin_may_not_set_its_parts() -> None:
    a = api.ContainerAdjustment()
    a.linux.rdt.remove = True
    b = api.ContainerAdjustment()
    b.linux.rdt.clos_id.value = "x"
    with pytest.raises(AdjustmentConflict, match="RdtClosID"):
        merge_adjustments([("a", a), ("b", b)])
    a.linux.rdt.clos_id.value = "mine"  # the remover itself may
    merged = merge_adjustments([("a", a)])
    assert merged.linux.rdt.clos_id.value == "mine" and not merged.linux.rdt.remove


# ---------------------------------------------------------------- invalid values


@pytest.mark.parametrize("setup,problem", [
    (lambda a: a.env.append(api.KeyValue(key="A=B", value="1")), "environment variable name"),
    (lambda a: a.env.append(api.KeyValue(key="", value="1")), "environment variable name"),
    (lambda a: a.env.append(api.KeyValue(key="A", value="x\0y")), "NUL"),
    (lambda a: a.mounts.append(api.Mount(destination="rel", type="tmpfs")), "absolute"),
    (lambda a: a.mounts.append(api.Mount(destination="/", type="tmpfs")), "container's /"),
    (lambda a: a.mounts.append(api.Mount(destination="/m", source="/s")), "type or a bind"),
    (lambda a: a.mounts.append(api.Mount(destination="/m", type="bind", source="rel")),
     "bind source"),
    (lambda a: a.rlimits.append(api.POSIXRlimit(type="RLIMIT_BOGUS")), "unknown rlimit"),
    (lambda a: a.rlimits.append(api.POSIXRlimit(type="RLIMIT_NOFILE", soft=2, hard=1)),
     "above hard"),
    (lambda a: a.hooks.prestart.append(api.Hook(path="hook")), "absolute"),
    (lambda a: a.linux.devices.append(api.LinuxDevice(path="/dev/x", type="z")), "type"),
    (lambda a: a.linux.devices.append(api.LinuxDevice(path="/dev/x", type="c", major=-1)),
     "negative"),
    (lambda a: a.linux.namespaces.append(api.LinuxNamespace(type="bogus")), "namespace type"),
    (lambda a: a.linux.namespaces.append(api.LinuxNamespace(type="network", path="rel")),
     "absolute"),
    (lambda a: setattr(a.linux, "cgroups_path", "/a/../b"), "cgroups path"),
    (lambda a: setattr(a.linux, "cgroups_path", "relative"), "cgroups path"),
    (lambda a: a.linux.oom_score_adj.CopyFrom(api.OptionalInt(value=1001)), "oom_score_adj"),
    (lambda a: setattr(a.linux.io_priority, "priority", 8), "I/O priority"),
    (lambda a: a.linux.seccomp_policy.syscalls.append(api.LinuxSyscall(names=["x"])),
     "default_action"),
    (lambda a: a.linux.resources.memory.limit.CopyFrom(i64(1024)), "memory_limit_in_bytes"),
    (lambda a: a.linux.resources.cpu.shares.CopyFrom(u64(10**6)), "cpu_shares"),
    (lambda a: a.linux.resources.cpu.shares.CopyFrom(u64(2**64 - 1)), "resources"),
    (lambda a: a.linux.resources.cpu.period.CopyFrom(u64(10)), "cpu_period"),
    (lambda a: setattr(a.linux.resources.cpu, "cpus", "0-a"), "CPU or memory-node list"),
    (lambda a: a.linux.resources.hugepage_limits.append(api.HugepageLimit(page_size="2XB")),
     "huge page size"),
    (lambda a: a.linux.resources.memory.kernel.CopyFrom(i64(1)), "kernel memory"),
    (lambda a: a.linux.resources.memory.swappiness.CopyFrom(u64(101)), "swappiness"),
    (lambda a: setattr(a.linux.resources.pids, "limit", -2), "pids limit"),
    (lambda a: setattr(a.linux.net_devices["eth1"], "name", "net1"), "network devices"),
    (lambda a: setattr(a.linux.memory_policy, "nodes", "0"), "memory policy"),
    (lambda a: a.CDI_devices.append(api.CDIDevice()), "CDI device needs a name"),
    (lambda a: a.args.extend([""]), "empty command line"),
])
def test_invalid_values_name_the_plugin(setup: Any, problem: str) -> None:
    adj = api.ContainerAdjustment()
    setup(adj)
    with pytest.raises(AdjustmentError) as exc:
        merge_adjustments([("ok", api.ContainerAdjustment()), ("bad-plugin", adj)])
    assert '"bad-plugin"' in str(exc.value) and problem in str(exc.value)
    assert not isinstance(exc.value, AdjustmentConflict)


# ---------------------------------------------------------------- updates


def upd(cid: str, ignore: bool = False, **mem: int) -> api.ContainerUpdate:
    u = api.ContainerUpdate(container_id=cid, ignore_failure=ignore)
    if "limit" in mem:
        u.linux.resources.memory.limit.value = mem["limit"]
    if "shares" in mem:
        u.linux.resources.cpu.shares.value = mem["shares"]
    return u


def test_merge_updates_combines_per_container_in_order() -> None:
    merged = merge_updates([
        ("a", [upd("c2", limit=64 * MiB), upd("c1", shares=100)]),
        ("b", [upd("c2", shares=200)]),
    ])
    assert [u.container_id for u in merged] == ["c2", "c1"]
    c2 = merged[0].linux.resources
    assert c2.memory.limit.value == 64 * MiB and c2.cpu.shares.value == 200


def test_merge_updates_conflict_names_both_and_the_container() -> None:
    with pytest.raises(AdjustmentConflict,
                       match=r'"b" and "a" both tried to set MemLimit of container c2'):
        merge_updates([("a", [upd("c2", limit=64 * MiB)]), ("b", [upd("c2", limit=80 * MiB)])])


def test_ignore_failure_needs_every_asker() -> None:
    assert merge_updates([("a", [upd("c", True, shares=2)])])[0].ignore_failure
    merged = merge_updates([("a", [upd("c", True, shares=2)]), ("b", [upd("c", limit=64 * MiB)])])
    assert not merged[0].ignore_failure


def test_update_of_the_container_being_created_is_refused() -> None:
    with pytest.raises(AdjustmentError, match=r'"a": asked to update container new'):
        merge_updates([("a", [upd("new", shares=2)])], creating="new")
    with pytest.raises(AdjustmentError, match="container_id"):
        merge_updates([("a", [upd("", shares=2)])])
    with pytest.raises(AdjustmentError, match=r'"a": resources: .*cpu_shares'):
        merge_updates([("a", [upd("c", shares=10**7)])])


def test_take_update_splits_the_requested_container() -> None:
    merged = merge_updates([("a", [upd("other", shares=3), upd("me", limit=64 * MiB)])])
    own, others = take_update(merged, "me")
    assert own is not None and own.memory.limit.value == 64 * MiB
    assert [u.container_id for u in others] == ["other"]
    assert take_update(others, "me") == (None, others)


def test_to_cri_resources_overlays_what_is_set() -> None:
    base = pb.LinuxContainerResources(cpu_shares=512, cpu_period=100000, cpu_quota=20000,
                                      memory_limit_in_bytes=256 * MiB, cpuset_cpus="0-1")
    base.hugepage_limits.append(pb.HugepageLimit(page_size="1GB", limit=0))
    r = api.LinuxResources()
    r.memory.limit.value = 128 * MiB
    r.cpu.cpus = "1"
    r.hugepage_limits.append(api.HugepageLimit(page_size="2MB", limit=2 * MiB))
    r.unified["memory.high"] = "max"
    out = to_cri_resources(base, r)
    assert out.cpu_shares == 512 and out.cpu_quota == 20000 and out.cpu_period == 100000
    assert out.memory_limit_in_bytes == 128 * MiB == out.memory_swap_limit_in_bytes
    assert out.cpuset_cpus == "1"
    assert {h.page_size: h.limit for h in out.hugepage_limits} == {"1GB": 0, "2MB": 2 * MiB}
    assert dict(out.unified) == {"memory.high": "max"}
    assert base.memory_limit_in_bytes == 256 * MiB  # the base is not touched


@pytest.mark.parametrize("setup,name", [
    (lambda r: r.memory.reservation.CopyFrom(i64(1)), "memory reservation"),
    (lambda r: r.cpu.realtime_runtime.CopyFrom(i64(1)), "CPU realtime runtime"),
    (lambda r: setattr(r.pids, "limit", 3), "pids limit"),
    (lambda r: r.blockio_class.CopyFrom(api.OptionalString(value="x")), "block I/O class"),
    (lambda r: r.rdt_class.CopyFrom(api.OptionalString(value="x")), "RDT class"),
    (lambda r: r.devices.append(api.LinuxDeviceCgroup(allow=True)), "device cgroup rules"),
    (lambda r: r.memory.limit.CopyFrom(i64(5)), "memory_limit_in_bytes"),
])
def test_to_cri_resources_refuses_what_it_cannot_carry(setup: Any, name: str) -> None:
    r = api.LinuxResources()
    setup(r)
    with pytest.raises(AdjustmentError, match=name):
        to_cri_resources(pb.LinuxContainerResources(), r, "update of container c")

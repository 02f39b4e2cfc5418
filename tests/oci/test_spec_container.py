"""container_spec(): each CRI/image rule, field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci import bindopts
from pycri.oci.seccomp import default_profile
from pycri.oci.spec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    DEFAULT_MASKED_PATHS,
    DEFAULT_PATH,
    DEFAULT_READONLY_PATHS,
    DeviceInfo,
    ImageConfig,
    Rlimit,
    capabilities_from_mask,
    cgroups_path,
    cri_mounts,
    image_volume_key,
    resources_to_oci,
    rro_key,
)
from pycri.oci.users import ResolvedUser

from .specutil import IMAGE, build, container_config, mount_at, sandbox_config


def test_is_plain_json_and_deterministic() -> None:
    a, b = build(), build()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["ociVersion"] == "1.0.2"
    assert a["root"] == {"path": "/r/rootfs", "readonly": False}


# ---- args


def args_for(command: list[str], args: list[str], image: ImageConfig = IMAGE) -> list[str]:
    cfg = container_config()
    cfg.command.extend(command)
    cfg.args.extend(args)
    return list(build(cfg, image=image)["process"]["args"])


def test_args_image_default() -> None:
    assert args_for([], []) == ["/entry", "cmd1", "cmd2"]


def test_args_replace_cmd_keep_entrypoint() -> None:
    assert args_for([], ["x"]) == ["/entry", "x"]


def test_command_replaces_entrypoint_and_drops_cmd() -> None:
    assert args_for(["/bin/sh"], []) == ["/bin/sh"]


def test_command_and_args() -> None:
    assert args_for(["/bin/sh"], ["-c", "true"]) == ["/bin/sh", "-c", "true"]


def test_image_cmd_only() -> None:
    assert args_for([], [], ImageConfig(cmd=("/bin/sh",))) == ["/bin/sh"]


def test_empty_args_invalid() -> None:
    with pytest.raises(InvalidArgument, match="no command"):
        args_for([], [], ImageConfig())


# ---- env, cwd, terminal


def test_env_order_and_override() -> None:
    cfg = container_config()
    cfg.envs.add(key="B", value=b"cri")
    cfg.envs.add(key="C", value=b"cri")
    env = build(cfg)["process"]["env"]
    assert env == [DEFAULT_PATH, "HOSTNAME=podhost", "A=img", "B=cri", "C=cri"]


def test_image_path_replaces_default_in_place() -> None:
    env = build(image=ImageConfig(cmd=("x",), env=("PATH=/bin",)), hostname="")["process"]["env"]
    assert env == ["PATH=/bin"]


def test_cri_path_wins() -> None:
    cfg = container_config()
    cfg.envs.add(key="PATH", value=b"/opt")
    assert build(cfg)["process"]["env"][0] == "PATH=/opt"


@pytest.mark.parametrize("key", ["", "A=B"])
def test_bad_env_key(key: str) -> None:
    cfg = container_config()
    cfg.envs.add(key=key, value=b"v")
    with pytest.raises(InvalidArgument, match="environment"):
        build(cfg)


def test_nul_in_env_value() -> None:
    cfg = container_config()
    cfg.envs.add(key="K", value=b"a\0b")
    with pytest.raises(InvalidArgument, match="NUL"):
        build(cfg)


def test_cwd_precedence() -> None:
    assert build()["process"]["cwd"] == "/"
    img = ImageConfig(cmd=("x",), working_dir="/img")
    assert build(image=img)["process"]["cwd"] == "/img"
    cfg = container_config()
    cfg.working_dir = "/cri"
    assert build(cfg, image=img)["process"]["cwd"] == "/cri"
    cfg.working_dir = "rel"
    with pytest.raises(InvalidArgument, match="absolute"):
        build(cfg)


def test_terminal() -> None:
    assert build()["process"]["terminal"] is False
    cfg = container_config()
    cfg.tty = True
    assert build(cfg)["process"]["terminal"] is True


def test_rlimits_from_context() -> None:
    assert "rlimits" not in build()["process"]
    s = build(rlimits=(Rlimit("RLIMIT_NOFILE", 1024, 4096),))
    assert s["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 4096}]


def test_user() -> None:
    u = build(user=ResolvedUser(1000, 2000, (2000, 3000)))["process"]["user"]
    assert u == {"uid": 1000, "gid": 2000, "additionalGids": [2000, 3000]}
    assert "additionalGids" not in build(user=ResolvedUser(1, 1))["process"]["user"]


# ---- oom score


@pytest.mark.parametrize(
    ("requested", "minimum", "expected"),
    [(500, 0, 500), (-500, 0, 0), (-500, -1000, -500), (-999, -998, -998), (2000, 0, 1000)],
)
def test_oom_score_adj_clamped(requested: int, minimum: int, expected: int) -> None:
    cfg = container_config()
    cfg.linux.resources.oom_score_adj = requested
    assert build(cfg, min_oom_score_adj=minimum)["process"]["oomScoreAdj"] == expected


# ---- capabilities


def caps_for(
    add: list[str] = [],  # noqa: B006 - read only
    drop: list[str] = [],  # noqa: B006
    ambient: list[str] = [],  # noqa: B006
    privileged: bool = False,
) -> dict[str, list[str]]:
    cfg = container_config()
    sb = sandbox_config()
    c = cfg.linux.security_context.capabilities
    c.add_capabilities.extend(add)
    c.drop_capabilities.extend(drop)
    c.add_ambient_capabilities.extend(ambient)
    cfg.linux.security_context.privileged = privileged
    sb.linux.security_context.privileged = privileged
    return dict(build(cfg, sb)["process"]["capabilities"])


def test_default_caps() -> None:
    c = caps_for()
    assert set(c["bounding"]) == set(DEFAULT_CAPABILITIES)
    assert c["effective"] == c["permitted"] == c["bounding"]
    assert c["inheritable"] == [] and c["ambient"] == []


def test_add_and_drop() -> None:
    c = caps_for(add=["NET_ADMIN", "cap_sys_time"], drop=["CAP_CHOWN", "kill"])
    assert "CAP_NET_ADMIN" in c["bounding"] and "CAP_SYS_TIME" in c["effective"]
    assert "CAP_CHOWN" not in c["permitted"] and "CAP_KILL" not in c["bounding"]


def test_add_all() -> None:
    assert caps_for(add=["ALL"])["bounding"] == list(ALL_CAPABILITIES)
    assert "CAP_SYS_ADMIN" not in caps_for(add=["ALL"], drop=["SYS_ADMIN"])["bounding"]


def test_drop_all_then_add() -> None:
    assert caps_for(drop=["ALL"])["bounding"] == []
    assert caps_for(drop=["ALL"], add=["NET_BIND_SERVICE"])["effective"] == [
        "CAP_NET_BIND_SERVICE"
    ]


def test_ambient_in_every_set() -> None:
    c = caps_for(drop=["ALL"], ambient=["NET_RAW"])
    for key in ("bounding", "effective", "permitted", "inheritable", "ambient"):
        assert c[key] == ["CAP_NET_RAW"], key


def test_unknown_capability() -> None:
    with pytest.raises(InvalidArgument, match="FLY"):
        caps_for(add=["FLY"])
    with pytest.raises(InvalidArgument, match="ALL"):
        caps_for(ambient=["ALL"])


# ---- privileged


def privileged_spec(**ctx: Any) -> dict[str, Any]:
    cfg = container_config()
    sb = sandbox_config()
    cfg.linux.security_context.privileged = True
    sb.linux.security_context.privileged = True
    return build(cfg, sb, **ctx)


def test_privileged_needs_privileged_sandbox() -> None:
    cfg = container_config()
    cfg.linux.security_context.privileged = True
    with pytest.raises(InvalidArgument, match="privileged sandbox"):
        build(cfg)


def test_privileged() -> None:
    host = (DeviceInfo("/dev/sda", "b", 8, 0, 0o660, 0, 6),)
    s = privileged_spec(host_devices=host, seccomp=default_profile())
    assert s["process"]["capabilities"]["bounding"] == list(ALL_CAPABILITIES)
    linux = s["linux"]
    assert "maskedPaths" not in linux and "readonlyPaths" not in linux
    assert "seccomp" not in linux
    assert linux["devices"] == [
        {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0, "fileMode": 0o660,
         "uid": 0, "gid": 6}
    ]  # fmt: skip
    assert linux["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "rw" in mount_at(s, "/sys")["options"]
    assert "rw" in mount_at(s, "/sys/fs/cgroup")["options"]


def test_unprivileged_sys_ro_and_devices_denied() -> None:
    s = build(host_devices=(DeviceInfo("/dev/sda", "b", 8, 0),))
    assert "ro" in mount_at(s, "/sys")["options"]
    assert "ro" in mount_at(s, "/sys/fs/cgroup")["options"]
    assert s["linux"]["devices"] == []
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]


def test_cri_devices() -> None:
    dev = DeviceInfo("/dev/xnull", "c", 1, 3, 0o666, 0, 0, "rw")
    s = build(devices=(dev,))
    assert s["linux"]["devices"][0]["path"] == "/dev/xnull"
    assert s["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
    ]


# ---- security knobs


def test_readonly_rootfs_and_no_new_privs() -> None:
    cfg = container_config()
    cfg.linux.security_context.readonly_rootfs = True
    cfg.linux.security_context.no_new_privs = True
    s = build(cfg)
    assert s["root"]["readonly"] is True
    assert s["process"]["noNewPrivileges"] is True
    assert "ro" in mount_at(s, "/etc/hosts")["options"]
    assert build()["process"]["noNewPrivileges"] is False
    assert "rw" in mount_at(build(), "/etc/hosts")["options"]


def test_masked_and_readonly_paths() -> None:
    s = build()
    assert s["linux"]["maskedPaths"] == list(DEFAULT_MASKED_PATHS)
    assert s["linux"]["readonlyPaths"] == list(DEFAULT_READONLY_PATHS)
    cfg = container_config()
    cfg.linux.security_context.masked_paths.append("/proc/x")
    cfg.linux.security_context.readonly_paths.append("/proc/y")
    s = build(cfg)
    assert s["linux"]["maskedPaths"] == ["/proc/x"]
    assert s["linux"]["readonlyPaths"] == ["/proc/y"]


def test_seccomp_from_context_gated_by_caps() -> None:
    assert "seccomp" not in build()["linux"]
    s = build(seccomp=default_profile())
    names = {n for r in s["linux"]["seccomp"]["syscalls"] for n in r["names"]}
    assert "unshare" not in names
    cfg = container_config()
    cfg.linux.security_context.capabilities.add_capabilities.append("SYS_ADMIN")
    s = build(cfg, seccomp=default_profile())
    names = {n for r in s["linux"]["seccomp"]["syscalls"] for n in r["names"]}
    assert "unshare" in names
    assert "capabilities" not in json.dumps(s["linux"]["seccomp"])


def test_apparmor_without_host_support() -> None:
    cfg = container_config()
    aa = cfg.linux.security_context.apparmor
    aa.profile_type = pb.SecurityProfile.RuntimeDefault
    assert "apparmorProfile" not in build(cfg)["process"]
    aa.profile_type = pb.SecurityProfile.Localhost
    aa.localhost_ref = "my-profile"
    with pytest.raises(InvalidArgument, match=r"'my-profile'.*AppArmor is not enabled"):
        build(cfg)
    cfg2 = container_config()
    cfg2.linux.security_context.apparmor_profile = "localhost/other"
    with pytest.raises(InvalidArgument, match="'other'"):
        build(cfg2)


def test_apparmor_with_host_support() -> None:
    cfg = container_config()
    cfg.linux.security_context.apparmor.profile_type = pb.SecurityProfile.Localhost
    cfg.linux.security_context.apparmor.localhost_ref = "localhost/p1"
    assert build(cfg, apparmor_enabled=True)["process"]["apparmorProfile"] == "p1"
    s = build(apparmor_enabled=True, apparmor_default_profile="pycri-default")
    assert s["process"]["apparmorProfile"] == "pycri-default"
    cfg.linux.security_context.apparmor.profile_type = pb.SecurityProfile.Unconfined
    assert "apparmorProfile" not in build(cfg, apparmor_enabled=True)["process"]


# ---- mounts


def test_default_mounts_present() -> None:
    s = build()
    dests = [m["destination"] for m in s["mounts"]]
    for d in ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup",
              "/etc/hosts", "/etc/resolv.conf", "/etc/hostname"):  # fmt: skip
        assert dests.count(d) == 1, d
    assert dests.index("/dev") < dests.index("/dev/pts")
    assert mount_at(s, "/dev/shm")["source"] == "/s/shm"
    assert mount_at(s, "/etc/hosts")["source"] == "/s/hosts"
    assert mount_at(s, "/etc/resolv.conf")["source"] == "/s/resolv.conf"
    assert mount_at(s, "/etc/hostname")["type"] == "bind"


def test_pod_files_absent_are_skipped_and_shm_falls_back_to_tmpfs() -> None:
    s = build(hosts_path=None, resolv_conf_path=None, hostname_path=None, shm_path=None)
    dests = [m["destination"] for m in s["mounts"]]
    assert "/etc/hosts" not in dests and "/etc/resolv.conf" not in dests
    assert mount_at(s, "/dev/shm")["type"] == "tmpfs"


def cri_mount(**kw: Any) -> dict[str, Any]:
    cfg = container_config()
    cfg.mounts.add(**kw)
    s = build(cfg)
    return {"mount": mount_at(s, str(kw["container_path"]).rstrip("/")), "spec": s}


def test_cri_mount_private_rw() -> None:
    r = cri_mount(container_path="/data", host_path="/host/data")
    assert r["mount"] == {"destination": "/data", "type": "bind", "source": "/host/data",
                          "options": ["rbind", "rprivate", "rw"]}  # fmt: skip
    assert "rootfsPropagation" not in r["spec"]["linux"]


def test_cri_mount_readonly_and_rro() -> None:
    m = cri_mount(container_path="/d", host_path="/h", readonly=True)["mount"]
    assert m["options"] == ["rbind", "rprivate", "ro"]
    mount = pb.Mount(container_path="/d", host_path="/h", readonly=True,
                     recursive_read_only=True)
    out, _ = cri_mounts([mount], {"/h": "/h", rro_key(0): "/staged/0"})
    assert out == [{"destination": "/d", "type": "bind", "source": "/staged/0",
                    "options": ["rbind", "rprivate", "ro"]}]  # fmt: skip
    with pytest.raises(InvalidArgument, match="not staged"):
        cri_mounts([mount], {"/h": "/h"})


def test_mount_options_merge_into_the_bind() -> None:
    m = cri_mount(container_path="/d", host_path="/h",
                  mount_options=["noexec", "nosuid", "nodev", "noexec"])["mount"]
    assert m["options"] == ["rbind", "rprivate", "rw", "noexec", "nosuid", "nodev"]
    # ro wins over rw both ways: a request can tighten a mount, never loosen it.
    assert cri_mount(container_path="/d", host_path="/h", mount_options=["ro"])["mount"][
        "options"] == ["rbind", "rprivate", "ro"]
    assert cri_mount(container_path="/d", host_path="/h", readonly=True,
                     mount_options=["rw", "exec"])["mount"]["options"] == [
        "rbind", "rprivate", "ro", "exec"]
    image = pb.Mount(container_path="/i", image=pb.ImageSpec(image="img"), readonly=True,
                     mount_options=["nodev"])
    out, _ = cri_mounts([image], {image_volume_key(0): "/views/0"})
    assert out[0]["options"] == ["rbind", "rprivate", "ro", "nodev"]
    rro = pb.Mount(container_path="/d", host_path="/h", readonly=True,
                   recursive_read_only=True, mount_options=["noexec"])
    out, _ = cri_mounts([rro], {rro_key(0): "/staged/0"})
    assert out[0]["options"] == ["rbind", "rprivate", "ro", "noexec"]


def test_bind_option_merge_rules() -> None:
    assert bindopts.merge(["rbind", "rw", "exec"], ["noexec"]) == ["rbind", "rw", "noexec"]
    assert bindopts.merge(["rw"], ["nosuid", "suid", "dev", "nodev"]) == [
        "rw", "nosuid", "nodev"]
    assert bindopts.merge(["rw"], ["noatime", "strictatime", "relatime"]) == ["rw", "relatime"]
    assert bindopts.merge(["ro"], ["ro", "ro"]) == ["ro"]
    assert bindopts.option_problem("noexec") is None
    assert "'mode=0755' is not a bind-mount option" in str(bindopts.option_problem("mode=0755"))
    assert bindopts.mount_attrs(["ro", "noexec", "nosuid", "nodev", "relatime"]) == 0xF


def test_rro_needs_readonly_and_private() -> None:
    with pytest.raises(InvalidArgument, match="needs readonly"):
        cri_mount(container_path="/d", host_path="/h", recursive_read_only=True)
    with pytest.raises(InvalidArgument, match="private propagation"):
        cri_mount(container_path="/d", host_path="/h", readonly=True, recursive_read_only=True,
                  propagation=pb.PROPAGATION_HOST_TO_CONTAINER)  # fmt: skip


def test_propagation_and_rootfs_propagation() -> None:
    r = cri_mount(container_path="/d", host_path="/h", propagation=pb.PROPAGATION_HOST_TO_CONTAINER)
    assert "rslave" in r["mount"]["options"]
    assert r["spec"]["linux"]["rootfsPropagation"] == "rslave"
    cfg = container_config()
    cfg.mounts.add(container_path="/a", host_path="/h", propagation=pb.PROPAGATION_BIDIRECTIONAL)
    cfg.mounts.add(
        container_path="/b", host_path="/h", propagation=pb.PROPAGATION_HOST_TO_CONTAINER
    )
    s = build(cfg)
    assert "rshared" in mount_at(s, "/a")["options"]
    assert s["linux"]["rootfsPropagation"] == "rshared"


def test_cri_mount_replaces_default_and_resolved_source() -> None:
    cfg = container_config()
    cfg.mounts.add(container_path="/etc/hosts/", host_path="/link/hosts")
    s = build(cfg, mount_sources={"/link/hosts": "/real/hosts"})
    m = mount_at(s, "/etc/hosts")
    assert m["source"] == "/real/hosts"


def test_cri_mounts_sorted_parents_first() -> None:
    cfg = container_config()
    cfg.mounts.add(container_path="/data/sub/x", host_path="/h1")
    cfg.mounts.add(container_path="/data", host_path="/h2")
    dests = [m["destination"] for m in build(cfg)["mounts"]]
    assert dests.index("/data") < dests.index("/data/sub/x")


@pytest.mark.parametrize(
    ("path", "host", "message"),
    [("rel", "/h", "absolute"), ("/", "/h", "container's /"), ("/x", "", "host path is empty")],
)
def test_bad_cri_mounts(path: str, host: str, message: str) -> None:
    cfg = container_config()
    cfg.mounts.add(container_path=path, host_path=host)
    with pytest.raises(InvalidArgument, match=message):
        build(cfg)


# ---- namespaces, hostname, sysctls


def ns_of(spec: dict[str, Any]) -> dict[str, str | None]:
    return {n["type"]: n.get("path") for n in spec["linux"]["namespaces"]}


def ns_spec(
    network: pb.NamespaceMode = pb.POD,
    pid: pb.NamespaceMode = pb.POD,
    ipc: pb.NamespaceMode = pb.POD,
    **ctx: Any,
) -> dict[str, Any]:
    cfg = container_config()
    o = cfg.linux.security_context.namespace_options
    o.network, o.pid, o.ipc = network, pid, ipc
    return build(cfg, **ctx)


def test_pod_namespaces_joined() -> None:
    assert ns_of(ns_spec()) == {
        "mount": None,
        "network": "/run/netns/pod",
        "uts": "/proc/10/ns/uts",
        "ipc": "/proc/10/ns/ipc",
        "pid": "/proc/10/ns/pid",
    }


def test_host_namespaces_omitted_and_no_hostname() -> None:
    s = ns_spec(network=pb.NODE, pid=pb.NODE, ipc=pb.NODE)
    assert ns_of(s) == {"mount": None}
    assert "hostname" not in s
    assert ns_spec()["hostname"] == "podhost"


def test_container_pid_and_target() -> None:
    assert ns_of(ns_spec(pid=pb.CONTAINER))["pid"] is None
    assert "pid" in ns_of(ns_spec(pid=pb.CONTAINER))
    s = ns_spec(pid=pb.TARGET, pid_ns="/proc/77/ns/pid")
    assert ns_of(s)["pid"] == "/proc/77/ns/pid"
    with pytest.raises(InvalidArgument, match="target"):
        ns_spec(pid=pb.TARGET, pid_ns=None)


def test_missing_pod_namespace_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="network"):
        ns_spec(net_ns=None)


def test_sysctls_from_sandbox() -> None:
    assert build()["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0"}


# ---- cgroups and resources


def test_cgroups_path() -> None:
    assert build()["linux"]["cgroupsPath"] == "/kubepods/pod1/pycri-c1"
    assert cgroups_path("", "cgroupfs", "x") == "/pycri/pycri-x"
    assert cgroups_path("kubepods", "cgroupfs", "x") == "/kubepods/pycri-x"
    assert cgroups_path("kubepods-pod1.slice", "systemd", "x") == "kubepods-pod1.slice:pycri:x"
    assert cgroups_path("", "systemd", "x") == "system.slice:pycri:x"
    for parent, driver in (("/a/b", "systemd"), ("/a/../b", "cgroupfs"), ("", "nope")):
        with pytest.raises(InvalidArgument):
            cgroups_path(parent, driver, "x")


def test_resources_to_oci_full() -> None:
    r = pb.LinuxContainerResources(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=1 << 26,
        memory_swap_limit_in_bytes=1 << 27, cpuset_cpus="0-1", cpuset_mems="0",
        oom_score_adj=100,
    )  # fmt: skip
    r.hugepage_limits.add(page_size="2MB", limit=1 << 21)
    r.unified["memory.high"] = "1000000"
    assert resources_to_oci(r) == {
        "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1", "mems": "0"},
        "memory": {"limit": 1 << 26, "swap": 1 << 27},
        "hugepageLimits": [{"pageSize": "2MB", "limit": 1 << 21}],
        "unified": {"memory.high": "1000000"},
    }


def test_resources_to_oci_empty_and_in_spec() -> None:
    assert resources_to_oci(pb.LinuxContainerResources()) == {}
    cfg = container_config()
    cfg.linux.resources.memory_limit_in_bytes = 1 << 24
    assert build(cfg)["linux"]["resources"]["memory"] == {"limit": 1 << 24}


# ---- annotations


def test_annotations() -> None:
    cfg = container_config()
    cfg.annotations["user"] = "x"
    cfg.annotations["io.kubernetes.cri.container-type"] = "forged"
    a = build(cfg)["annotations"]
    assert a["user"] == "x"
    assert a["io.kubernetes.cri.container-type"] == "container"
    assert a["io.kubernetes.cri.sandbox-id"] == "s1"
    assert a["io.kubernetes.cri.container-name"] == "ctr"
    assert a["io.kubernetes.cri.sandbox-name"] == "pod"
    assert a["io.kubernetes.cri.sandbox-namespace"] == "ns"
    assert a["io.kubernetes.cri.sandbox-uid"] == "uid-1"
    assert a["io.kubernetes.cri.image-name"] == "docker.io/library/busybox:latest"


# ---- image config parsing


def test_image_config_from_oci() -> None:
    full = {
        "architecture": "amd64",
        "config": {
            "User": "1000:1000", "Env": ["A=1"], "Entrypoint": ["/e"], "Cmd": ["c"],
            "WorkingDir": "/w", "StopSignal": "SIGQUIT", "Labels": {"l": "v"},
            "ExposedPorts": {"80/tcp": {}}, "Volumes": {"/v": {}},
        },
    }  # fmt: skip
    ic = ImageConfig.from_oci(full)
    assert ic == ImageConfig(("/e",), ("c",), ("A=1",), "/w", "1000:1000", "SIGQUIT", {"l": "v"})
    assert ImageConfig.from_oci(full["config"]) == ic  # type: ignore[arg-type]
    assert ImageConfig.from_oci({"config": None}) == ImageConfig()
    assert ImageConfig.from_oci({"Cmd": None, "Labels": None}) == ImageConfig()


@pytest.mark.parametrize(
    "bad",
    [{"Cmd": "sh"}, {"Env": [1]}, {"User": 0}, {"Labels": {"a": 1}}, {"config": []}],
)
def test_image_config_bad_types(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument, match="image config"):
        ImageConfig.from_oci(bad)


def test_capabilities_limited_to_available() -> None:
    have = tuple(c for c in ALL_CAPABILITIES if c != "CAP_SYS_RESOURCE")
    cfg = container_config()
    cfg.linux.security_context.capabilities.add_capabilities.extend(["ALL"])
    c = build(cfg, available_capabilities=have)["process"]["capabilities"]
    assert c["bounding"] == list(have)
    assert privileged_spec(available_capabilities=have)["process"]["capabilities"][
        "effective"
    ] == list(have)


def test_capabilities_from_mask() -> None:
    assert capabilities_from_mask(0) == ()
    assert capabilities_from_mask(0b101) == ("CAP_CHOWN", "CAP_DAC_READ_SEARCH")
    assert capabilities_from_mask(0x1FFFEFFFFFF) == tuple(
        c for c in ALL_CAPABILITIES if c != "CAP_SYS_RESOURCE"
    )

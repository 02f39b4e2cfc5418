"""User namespaces in the OCI specs (pure): the pod's pinned namespace joined by the infra
and every container with its mappings, idmapped mounts bound from their staged copies,
users outside the mappings refused, and the runtime versions pycri trusts."""

from __future__ import annotations

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.spec.build import SandboxContext, sandbox_spec
from pycri.oci.spec.mounts import cri_mounts, idmap_key, rro_key
from pycri.oci.spec.namespaces import IDMap, UserNamespace, pod_id_maps
from pycri.oci.userns import Support, runtime_problem
from pycri.oci.users import ResolvedUser

from .specutil import build, sandbox_config

MAP = IDMap(0, 65536, 65536)
NS = UserNamespace("/state/sandboxes/s1/userns", (MAP,), (IDMap(0, 131072, 65536),))
OCI_MAPS = {"uidMappings": [{"containerID": 0, "hostID": 65536, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 131072, "size": 65536}]}


def test_container_joins_the_pods_user_namespace_with_its_mappings() -> None:
    spec = build(userns=NS)
    assert spec["linux"]["namespaces"][:2] == [{"type": "mount"},
                                               {"type": "user", "path": NS.path}]
    assert {k: spec["linux"][k] for k in OCI_MAPS} == OCI_MAPS
    plain = build()
    assert "uidMappings" not in plain["linux"]
    assert all(n["type"] != "user" for n in plain["linux"]["namespaces"])


def test_infra_joins_the_pinned_namespace() -> None:
    ctx = SandboxContext(sandbox_id="s1", rootfs="/r", net_ns="/run/netns/p", userns=NS)
    spec = sandbox_spec(sandbox_config(), ctx)
    assert {"type": "user", "path": NS.path} in spec["linux"]["namespaces"]
    assert {"type": "network", "path": "/run/netns/p"} in spec["linux"]["namespaces"]
    assert {k: spec["linux"][k] for k in OCI_MAPS} == OCI_MAPS


@pytest.mark.parametrize(("user", "message"), [
    (ResolvedUser(65536, 0, (0,)), "uid 65536 is not mapped"),
    (ResolvedUser(0, 70000, (70000,)), "gid 70000 is not mapped"),
    (ResolvedUser(0, 0, (0, 65536)), "gid 65536 is not mapped in the pod's user namespace "
     "(0-65535)"),
])
def test_users_outside_the_mappings_are_refused(user: ResolvedUser, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(userns=NS, user=user)
    build(userns=NS, user=ResolvedUser(65535, 65535, (65535,)))


def test_idmapped_mounts_bind_their_staged_copy() -> None:
    m = pb.IDMapping(host_id=65536, length=65536)
    idm = pb.Mount(container_path="/d", host_path="/h", uidMappings=[m], gidMappings=[m])
    both = pb.Mount(container_path="/e", host_path="/h", readonly=True, recursive_read_only=True,
                    uidMappings=[m], gidMappings=[m])
    out, _ = cri_mounts([idm, both], {"/h": "/h", idmap_key(0): "/st/0", idmap_key(1): "/st/1",
                                      rro_key(1): "/wrong"})
    assert [(x["source"], x["options"]) for x in out] == [
        ("/st/0", ["rbind", "rprivate", "rw"]), ("/st/1", ["rbind", "rprivate", "ro"])]
    with pytest.raises(InvalidArgument, match="idmapped:0"):
        cri_mounts([idm], {"/h": "/h"})


def test_pod_id_maps_only_for_mode_pod() -> None:
    sb = sandbox_config()
    assert pod_id_maps(sb) is None
    ns = sb.linux.security_context.namespace_options
    ns.userns_options.mode = pb.NODE
    assert pod_id_maps(sb) is None
    ns.userns_options.mode = pb.POD
    ns.userns_options.uids.add(host_id=65536, length=65536)
    ns.userns_options.gids.add(host_id=131072, length=65536)
    assert pod_id_maps(sb) == ((MAP,), (IDMap(0, 131072, 65536),))


@pytest.mark.parametrize(("output", "problem"), [
    ("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n", None),
    ("runc version 1.2.0\n", None),
    ("crun version 1.8.1\ncommit: f8a0\n", None),
    ("runc version 1.0.2\n", "runc 1.0 is older than 1.1"),
    ("crun version 1.4.5\n", "crun 1.4 is older than 1.8"),
    ("youki version 0.3.0\n", "not a runtime known to support user namespaces"),
    ("", "said 'nothing'"),
])
def test_runtime_versions(output: str, problem: str | None) -> None:
    found = runtime_problem(output)
    assert found == problem if problem is None else problem in (found or "")


def test_support_by_handler() -> None:
    support = Support(None, {"runc": None, "old": "runc 1.0 is older than 1.1", "": None})
    assert support.problem("runc") is None and support.problem("") is None
    assert support.problem("old") == "runc 1.0 is older than 1.1"
    assert support.problem("nope") == "unknown handler"
    assert Support("no idmapped overlay", {"runc": None}).problem("runc") == "no idmapped overlay"


def test_devpts_group_only_where_the_namespace_maps_it() -> None:
    def devpts(ns: UserNamespace | None) -> list[str]:
        return next(m for m in build(userns=ns)["mounts"]
                    if m["destination"] == "/dev/pts")["options"]

    assert "gid=5" in devpts(None) and "gid=5" in devpts(NS)
    tiny = UserNamespace(NS.path, (IDMap(0, 65536, 1),), (IDMap(0, 65536, 1),))
    assert not [o for o in devpts(tiny) if o.startswith("gid=")]

"""The namespaces a process creates, joins or shares with the host, and the pod's own
user namespace with its ID mappings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.oci.users import ResolvedUser


@dataclass(frozen=True)
class IDMap:
    """One line of a uid_map or gid_map: `length` IDs from `container_id` on, as `host_id` on."""

    container_id: int
    host_id: int
    length: int

    def oci(self) -> dict[str, int]:
        return {"containerID": self.container_id, "hostID": self.host_id, "size": self.length}


def _mapped(maps: Iterable[IDMap], i: int) -> bool:
    return any(m.container_id <= i < m.container_id + m.length for m in maps)


@dataclass(frozen=True)
class UserNamespace:
    """A pod's own user namespace: the pinned namespace to join and its mappings (the
    runtime wants them even when it joins, to know the host IDs of container root)."""

    path: str
    uids: tuple[IDMap, ...]
    gids: tuple[IDMap, ...]

    def check_user(self, user: ResolvedUser) -> None:
        """The process's IDs must exist in the namespace, or the runtime's setuid fails."""
        for kind, ids, maps in (("uid", (user.uid,), self.uids),
                                ("gid", (user.gid, *user.additional_gids), self.gids)):
            for i in ids:
                if not _mapped(maps, i):
                    raise InvalidArgument(
                        f"{kind} {i} is not mapped in the pod's user namespace ("
                        + ", ".join(f"{m.container_id}-{m.container_id + m.length - 1}"
                                    for m in maps) + ")")

    def maps_gid(self, gid: int) -> bool:
        return _mapped(self.gids, gid)

    def linux(self) -> dict[str, Any]:
        return {"uidMappings": [m.oci() for m in self.uids],
                "gidMappings": [m.oci() for m in self.gids]}


def pod_id_maps(config: pb.PodSandboxConfig) -> tuple[tuple[IDMap, ...], tuple[IDMap, ...]] | None:
    """The pod's (uid, gid) mappings when it asks for its own user namespace, else None.

    Unset options, or mode NODE, keep the host's user namespace; the request gate has
    refused every other mode and every mapping pycri cannot honour.
    """
    ns = config.linux.security_context.namespace_options
    if not ns.HasField("userns_options") or ns.userns_options.mode != pb.POD:
        return None
    opts = ns.userns_options
    return (tuple(IDMap(m.container_id, m.host_id, m.length) for m in opts.uids),
            tuple(IDMap(m.container_id, m.host_id, m.length) for m in opts.gids))


def _join(kind: str, path: str | None, what: str) -> dict[str, str]:
    if not path:
        raise InvalidArgument(f"the sandbox has no {what} namespace to join")
    return {"type": kind, "path": path}


def container_namespaces(
    opts: pb.NamespaceOption,
    userns: UserNamespace | None,
    net_ns: str | None,
    uts_ns: str | None,
    ipc_ns: str | None,
    pid_ns: str | None,
) -> list[dict[str, str]]:
    """Mount ns always new; net/uts/ipc of the pod (or host); pid per its mode (`pid_ns`
    is the infra's for POD, the target container's for TARGET); the pod's user
    namespace when it has one."""
    ns: list[dict[str, str]] = [{"type": "mount"}]
    if userns is not None:
        ns.append({"type": "user", "path": userns.path})
    if opts.network != pb.NODE:
        ns.append(_join("network", net_ns, "network"))
        ns.append(_join("uts", uts_ns, "UTS"))
    if opts.ipc == pb.CONTAINER:
        ns.append({"type": "ipc"})
    elif opts.ipc != pb.NODE:
        ns.append(_join("ipc", ipc_ns, "IPC"))
    if opts.pid == pb.CONTAINER:
        ns.append({"type": "pid"})
    elif opts.pid == pb.TARGET:
        if not pid_ns:
            raise InvalidArgument(f"no PID namespace of target container {opts.target_id!r}")
        ns.append({"type": "pid", "path": pid_ns})
    elif opts.pid == pb.POD:
        ns.append(_join("pid", pid_ns, "PID"))
    return ns


def sandbox_namespaces(
    opts: pb.NamespaceOption, userns: UserNamespace | None, net_ns: str | None
) -> list[dict[str, str]]:
    """The infra creates the pod's namespaces, except those shared with the host; it joins
    the pinned network namespace (`net_ns`, None: a new one) and the pod's user one."""
    ns: list[dict[str, str]] = [{"type": "mount"}]
    if userns is not None:
        ns.append({"type": "user", "path": userns.path})
    if opts.network != pb.NODE:
        ns.append({"type": "network", "path": net_ns} if net_ns else {"type": "network"})
        ns.append({"type": "uts"})
    if opts.ipc != pb.NODE:
        ns.append({"type": "ipc"})
    if opts.pid != pb.NODE:
        ns.append({"type": "pid"})
    return ns

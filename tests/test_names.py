"""names.py: IDs, unique prefixes and the List calls' filter, as ListPodSandbox and
ListContainers apply it to records."""

from __future__ import annotations

import time

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument, NotFound
from pycri.names import filtered, new_id, resolve_prefix
from pycri.store.sandbox import Sandbox


def pod(sid: str, **labels: str) -> Sandbox:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=sid), labels=labels)
    return Sandbox(id=sid, config=cfg, handler="runc", runtime_handler="",
                   created_at=time.time_ns(), state=pb.SANDBOX_READY)


def test_new_ids_are_64_hex_and_differ() -> None:
    a, b = new_id(), new_id()
    assert len(a) == 64 and int(a, 16) >= 0 and a != b


def test_resolve_prefix() -> None:
    ids = ["abc1", "abd2"]
    assert resolve_prefix("abc", ids, "container") == "abc1"
    with pytest.raises(InvalidArgument, match="ambiguous"):
        resolve_prefix("ab", ids, "container")
    with pytest.raises(NotFound, match="empty"):
        resolve_prefix("", ids, "container")


def test_filtered_by_id_prefix_state_and_every_selector_key() -> None:
    pods = [pod("aa1", app="web", tier="front"), pod("aa2", app="web"), pod("bb1", app="db")]
    pods[1].state = pb.SANDBOX_NOTREADY

    def ids(flt: pb.PodSandboxFilter | pb.PodSandboxStatsFilter) -> list[str]:
        return [p.id for p in filtered(pods, flt)]

    assert ids(pb.PodSandboxFilter()) == ["aa1", "aa2", "bb1"]
    assert ids(pb.PodSandboxFilter(id="aa")) == ["aa1", "aa2"]
    assert ids(pb.PodSandboxFilter(label_selector={"app": "web"})) == ["aa1", "aa2"]
    assert ids(pb.PodSandboxFilter(id="aa", label_selector={"tier": "front"})) == ["aa1"]
    assert ids(pb.PodSandboxFilter(state=pb.PodSandboxStateValue(
        state=pb.SANDBOX_NOTREADY))) == ["aa2"]
    assert ids(pb.PodSandboxFilter(state=pb.PodSandboxStateValue())) == ["aa1", "bb1"]
    assert ids(pb.PodSandboxStatsFilter(id="bb", label_selector={"app": "web"})) == []
    assert ids(pb.PodSandboxStatsFilter(label_selector={"app": ""})) == []  # must be there

"""oci/spec/capabilities.py: the default set, CRI adds/drops/ambient, the daemon's bounding set."""

from __future__ import annotations

import pytest

from pycri.errors import InvalidArgument
from pycri.oci.spec.capabilities import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    capabilities_from_mask,
)

from .specutil import build, container_config, privileged_spec, sandbox_config


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

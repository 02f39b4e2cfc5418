"""store/typed.py: a row's fields against its dataclass, before the record is built."""

from __future__ import annotations

import pytest

from pycri.store import typed
from pycri.store.container import Container
from pycri.store.sandbox import Sandbox


def test_fields_of_their_declared_types_pass() -> None:
    typed.check(Container, {"pid": 1, "reason": "Completed", "groups": [1, 2],
                            "resources": {"cpu_shares": 2}}, "c")
    typed.check(Sandbox, {"ips": ["10.0.0.1"], "own_cgroup": False, "created_at": 1}, "s")


@pytest.mark.parametrize(("data", "message"), [
    ({"pid": "1"}, "field pid is not int"),
    ({"pid": True}, "field pid is not int"),  # JSON true is no pid
    ({"pid": 2**63}, "field pid is not int"),  # past what a CRI int64 carries
    ({"reason": 1}, "field reason is not str"),
    ({"reason": "\ud800"}, "field reason is not str"),  # a lone surrogate: no UTF-8
    ({"groups": [1, "2"]}, "field groups is not list[int]"),
    ({"resources": []}, "field resources is not dict[str, typing.Any]"),
    ({"surprise": 1}, "unknown field 'surprise'"),
])
def test_a_field_of_another_type_is_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=f"^c: {message.replace('[', '.').replace(']', '.')}"):
        typed.check(Container, data, "c")

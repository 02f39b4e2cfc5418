"""oci/spec/image.py: the image config, parsed from untrusted JSON."""

from __future__ import annotations

import pytest

from pycri.errors import InvalidArgument
from pycri.oci.spec.image import ImageConfig


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

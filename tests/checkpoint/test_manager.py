"""What a restored container is (pycri/checkpoint/manager.py `restored_config`): the
CreateContainer request's config, whatever the archive asks for (issue 22, item 1); the
archive names the image and, where the request has none, the name and command."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from pycri.api import api_pb2 as pb
from pycri.checkpoint.manager import restored_config
from pycri.errors import FailedPrecondition, InvalidArgument


def dump(**config: Any) -> dict[str, Any]:
    archived = pb.ContainerConfig(image=pb.ImageSpec(image="registry/app:1"), **config)
    return {"config": json_format.MessageToDict(archived)}


def restricted() -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="restored"),
        image=pb.ImageSpec(image="checkpoint-image:latest"),
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            run_as_user=pb.Int64Value(value=1000),
            capabilities=pb.Capability(drop_capabilities=["ALL"]),
            seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))))


def test_the_request_sets_privilege_whatever_the_archive_asks() -> None:
    hostile = dump(linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        privileged=True, run_as_user=pb.Int64Value(value=0),
        capabilities=pb.Capability(add_capabilities=["ALL"]),
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined))),
        envs=[pb.KeyValue(key="FROM_ARCHIVE", value=b"1")])
    config = restored_config(hostile, restricted())
    want = restricted()
    want.image.image = "registry/app:1"  # only the image comes from the archive
    assert config == want


def test_a_mount_or_device_the_request_lacks_is_refused_by_name() -> None:
    host_root = dump(mounts=[pb.Mount(container_path="/host", host_path="/")],
                     devices=[pb.Device(container_path="/dev/sda", host_path="/dev/sda")])
    with pytest.raises(FailedPrecondition, match="mount /host, device /dev/sda, which the "
                                                 "request does not grant"):
        restored_config(host_root, restricted())
    granted = restricted()
    granted.mounts.add(container_path="/host", host_path="/srv/data")
    granted.devices.add(container_path="/dev/sda", host_path="/dev/null")
    config = restored_config(host_root, granted)
    assert [m.host_path for m in config.mounts] == ["/srv/data"]  # the request's source


def test_name_and_command_come_from_the_archive_only_where_the_request_has_none() -> None:
    archived = dump(metadata=pb.ContainerMetadata(name="counter"), command=["sh", "-c"],
                    args=["count"], working_dir="/work")
    bare = restored_config(archived, pb.ContainerConfig())
    assert (bare.metadata.name, list(bare.command), list(bare.args), bare.working_dir) == (
        "counter", ["sh", "-c"], ["count"], "/work")
    request = restricted()
    request.command[:] = ["sleep", "1"]
    own = restored_config(archived, request)
    assert (own.metadata.name, list(own.command), list(own.args), own.working_dir) == (
        "restored", ["sleep", "1"], [], "")


@pytest.mark.parametrize(("doc", "said"), [
    ({}, "names no image"),
    ({"config": {"image": {"image": ""}}}, "names no image"),
    ({"config": {"nosuchfield": 1}}, "the archive's container config is unreadable"),
    ({"config": {"mounts": "not a list"}}, "is unreadable"),
])
def test_a_malformed_archived_config_is_invalid_argument(doc: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        restored_config(doc, restricted())

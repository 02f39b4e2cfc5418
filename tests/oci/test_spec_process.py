"""oci/spec/process.py: argv (ENTRYPOINT/CMD rules), env, cwd, terminal, rlimits, user,
oom score."""

from __future__ import annotations

import pytest

from pycri.errors import InvalidArgument
from pycri.oci.spec.image import ImageConfig
from pycri.oci.spec.process import DEFAULT_PATH, Rlimit
from pycri.oci.users import ResolvedUser

from .specutil import IMAGE, build, container_config

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

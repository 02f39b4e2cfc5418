"""Reference normalisation and registries.conf resolution (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycri import errors
from pycri.image import reference
from pycri.image.auth import Auth, Secret, parse_challenge
from pycri.image.regconf import RegistriesConf, is_loopback


@pytest.mark.parametrize(
    ("ref", "want"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("library/busybox", "docker.io/library/busybox:latest"),
        ("docker.io/busybox", "docker.io/library/busybox:latest"),
        ("index.docker.io/library/busybox:1", "docker.io/library/busybox:1"),
        ("someone/app", "docker.io/someone/app:latest"),
        ("localhost/app", "localhost/app:latest"),
        ("127.0.0.1:5000/a/b:v1", "127.0.0.1:5000/a/b:v1"),
        ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
        ("quay.io/x/y@sha256:" + "a" * 64, "quay.io/x/y@sha256:" + "a" * 64),
        ("x:tag@sha256:" + "b" * 64, "docker.io/library/x@sha256:" + "b" * 64),
    ],
)
def test_normalise(ref: str, want: str) -> None:
    assert str(reference.parse(ref)) == want


def test_parts() -> None:
    r = reference.parse("busybox")
    assert (r.domain, r.path, r.tag, r.digest, r.object) == (
        "docker.io", "library/busybox", "latest", None, "latest")
    assert reference.parse("a@sha256:" + "c" * 64).object == "sha256:" + "c" * 64


@pytest.mark.parametrize(
    "bad", ["", "Busybox", "busybox:", "a@sha256:xyz", "a//b", " busybox", "a:b:c", "a/-b"]
)
def test_invalid(bad: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        reference.parse(bad)


@pytest.mark.parametrize("bad", ["127.0.0.1:99999/busybox", "localhost:0/a:v1", "h.io:65536/x"])
def test_port_out_of_range(bad: str) -> None:
    """Used to reach the socket layer and come back as INTERNAL (OverflowError)."""
    with pytest.raises(errors.InvalidArgument, match=r"port .* not in 1-65535"):
        reference.parse(bad)
    assert reference.parse("[::1]:5000/a").domain == "[::1]:5000"
    assert reference.parse("h.io:65535/x").domain == "h.io:65535"


def _conf(tmp_path: Path, text: str, dropin: str = "") -> RegistriesConf:
    (tmp_path / "r.conf").write_text(text)
    d = tmp_path / "r.d"
    d.mkdir(exist_ok=True)
    if dropin:
        (d / "10-x.conf").write_text(dropin)
    return RegistriesConf.load(str(tmp_path / "r.conf"), str(d))


def test_regconf_mirrors_in_order(tmp_path: Path) -> None:
    conf = _conf(tmp_path, """
unqualified-search-registries = ["docker.io"]
[[registry]]
prefix = "registry.k8s.io"
location = "registry.k8s.io"
[[registry.mirror]]
location = "127.0.0.1:5000"
insecure = true
[[registry.mirror]]
location = "mirror.example.com/cache"
[[registry]]
location = "gcr.io"
[[registry.mirror]]
location = "127.0.0.1:5000"
""")
    eps = conf.endpoints(reference.parse("registry.k8s.io/e2e-test-images/busybox:1.29-2"))
    assert [(e.host, e.repository, e.insecure, e.mirror) for e in eps] == [
        ("127.0.0.1:5000", "e2e-test-images/busybox", True, True),
        ("mirror.example.com", "cache/e2e-test-images/busybox", False, True),
        ("registry.k8s.io", "e2e-test-images/busybox", False, False),
    ]
    eps = conf.endpoints(reference.parse("gcr.io/k8s-staging-cri-tools/test-image-1"))
    assert [e.host for e in eps] == ["127.0.0.1:5000", "gcr.io"]
    # A registry that is not configured: itself only; docker.io goes to registry-1.
    eps = conf.endpoints(reference.parse("busybox"))
    assert [(e.api_host, e.repository) for e in eps] == [
        ("registry-1.docker.io", "library/busybox")]


def test_regconf_prefix_rewrite_blocked_and_dropin(tmp_path: Path) -> None:
    conf = _conf(tmp_path, """
[[registry]]
prefix = "example.com/team"
location = "other.example.org/mirror/team"
insecure = true
[[registry]]
prefix = "example.com"
location = "example.com"
[[registry]]
location = "blocked.example.com"
blocked = true
[[registry]]
prefix = "*.wild.example"
[[registry.mirror]]
location = "m.example"
""", dropin="""
[[registry]]
prefix = "example.com"
location = "example.com"
blocked = true
""")
    (ep,) = conf.endpoints(reference.parse("example.com/team/app:1"))
    assert (ep.host, ep.repository, ep.insecure) == ("other.example.org", "mirror/team/app", True)
    # "example.com/teamx" must not match the "example.com/team" prefix; the drop-in blocks it.
    with pytest.raises(errors.FailedPrecondition):
        conf.endpoints(reference.parse("example.com/teamx/app"))
    with pytest.raises(errors.FailedPrecondition):
        conf.endpoints(reference.parse("blocked.example.com/a"))
    eps = conf.endpoints(reference.parse("a.wild.example/x/y"))
    assert [(e.host, e.repository) for e in eps] == [
        ("m.example", "x/y"), ("a.wild.example", "x/y")]


def test_regconf_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match=r"r\.conf"):
        _conf(tmp_path, "[[registry]\n")
    with pytest.raises(errors.InvalidArgument, match="insecure"):
        _conf(tmp_path, '[[registry]]\nlocation = "a.b"\ninsecure = "yes"\n')
    # Absent files: no configuration at all.
    conf = RegistriesConf.load(str(tmp_path / "none.conf"), str(tmp_path / "none.d"))
    assert [e.host for e in conf.endpoints(reference.parse("quay.io/a/b"))] == ["quay.io"]


def test_a_secret_never_prints() -> None:
    """Issue 39: a credential shows as <redacted> however it is formatted, and still
    compares and hashes by its value (an Auth keys the token cache)."""
    import logging
    import pickle

    s = Secret("pw-SECRET")
    a = Auth(username="u", password=s, auth=s, identity_token=s, registry_token=s)
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "%s %r %s", (s, s, a), None)
    shown = [str(s), repr(s), f"{s}", f"{s!r:>20}", format(s, "^30"), record.getMessage(), str(a),
             repr(a), str(ValueError(s)), str(ValueError(a))]
    assert not [t for t in shown if "SECRET" in t] and "<redacted>" in shown[0]
    assert s.reveal() == "pw-SECRET" and s == Secret("pw-SECRET") and s != "pw-SECRET"
    assert hash(a) == hash(Auth(username="u", password=Secret("pw-SECRET"), auth=s,
                                identity_token=s, registry_token=s))
    assert not Secret() and repr(Secret()) == "''"
    with pytest.raises(TypeError):
        pickle.dumps(s)


def test_loopback_and_auth_forms() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost") and is_loopback("[::1]:5")
    assert not is_loopback("10.0.0.1:5000") and not is_loopback("example.com")
    assert Auth(username="u", password=Secret("p")).basic() == ("u", "p")
    assert Auth(auth=Secret("dTpwOnE=")).basic() == ("u", "p:q")
    assert Auth(identity_token=Secret("x")).basic() is None
    with pytest.raises(errors.InvalidArgument):
        Auth(auth=Secret("!!notbase64")).basic()
    for text in ("日本語", "\U0001f980", "dTpw\x00"):  # found by the fuzzer: INTERNAL
        with pytest.raises(errors.InvalidArgument, match="not base64"):
            Auth(auth=Secret(text)).basic()
    assert Auth(server_address="https://index.docker.io/v1/").applies_to("docker.io")
    assert not Auth(server_address="quay.io").applies_to("127.0.0.1:5000")
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"')
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "reg",
                      "scope": "repository:a/b:pull"}

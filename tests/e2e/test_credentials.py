"""Credentials never print (issue 39, item 3): a daemon at log level debug pulls with
every kind of credential a CRI AuthConfig carries, and through a redirect whose URL
carries a signature, and no secret appears in its log, in an error it answers, or on
/metrics. Before, the debug line of each PullImage showed the password, both tokens
and `auth`, and httpx's INFO line showed the presigned URL's query."""

from __future__ import annotations

import base64
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest

from pycri.api import api_pb2 as pb
from tests.conftest import PycriProcess
from tests.lib import images
from tests.lib.registry import AnswerFront, BearerFront, RedirectFront, Registry, free_port

PASSWORD = "pw-SECRET-basic"
WRONG = "pw-SECRET-wrong"
IDENTITY = "id-SECRET-refresh"
SIGNATURE = "QUERY-SECRET-sig"
SCOPE_TOKEN = "tok." + base64.urlsafe_b64encode(b"repository:busybox:pull").decode()


def _pull(cri: object, image: str, **auth: str) -> str:
    request = pb.PullImageRequest(image=pb.ImageSpec(image=image))
    if auth:
        request.auth.CopyFrom(pb.AuthConfig(**auth))  # type: ignore[arg-type]
    return cri.image.PullImage(request).image_ref  # type: ignore[attr-defined, no-any-return]


def test_no_credential_reaches_a_log_line_an_error_or_metrics(
        pycri_dirs: PycriProcess, registry: Registry, busybox: str, tmp_path: Path) -> None:
    basic = Registry(tmp_path / "basic", htpasswd=("alice", PASSWORD)).start()
    bearer = BearerFront(registry.addr, None)
    refresh = AnswerFront(registry.addr, f'{{"token": "{SCOPE_TOKEN}"}}'.encode())
    redirect = RedirectFront(registry.addr, SIGNATURE)
    metrics = f"127.0.0.1:{free_port()}"
    config = pycri_dirs.config
    config.write_text(f'metrics_address = "{metrics}"\n' + config.read_text())
    fronts = (bearer, refresh, redirect)
    for front in fronts:
        front.start()
    pycri_dirs.start()
    errors: list[str] = []
    try:
        layout = tmp_path / "layout"
        images.write_layout(layout, "v1", [images.busybox_spec()])
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                        "--dest-creds", f"alice:{PASSWORD}", f"oci:{layout}:v1",
                        f"docker://{basic.addr}/private:v1"], check=True, capture_output=True)
        cri = pycri_dirs.client()
        auth = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
        private = f"{basic.addr}/private:v1"
        assert _pull(cri, private, username="alice", password=PASSWORD)
        assert _pull(cri, private, auth=auth)
        with pytest.raises(grpc.RpcError) as e:
            _pull(cri, private, username="alice", password=WRONG)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        errors.append(e.value.details() or "")
        assert _pull(cri, f"{bearer.addr}/busybox:latest", registry_token=SCOPE_TOKEN)
        assert _pull(cri, f"{refresh.addr}/busybox:latest", identity_token=IDENTITY)
        assert any(IDENTITY.encode() in f for f in refresh.forms)  # the refresh grant
        # An image of its own, so its config blob is fetched (through the redirect).
        images.push_busybox(registry.addr, tmp_path / "layout2", name="redirected",
                            user="4321")
        assert _pull(cri, f"{redirect.addr}/redirected:latest")
        assert any(p.startswith("/cdn/") for p in redirect.requests)
        with pytest.raises(grpc.RpcError) as e:  # a token service that refuses
            _pull(cri, f"127.0.0.1:{free_port()}/busybox:latest", password=PASSWORD,
                  username="alice", identity_token=IDENTITY)
        errors.append(e.value.details() or "")
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        cri.channel.close()
    finally:
        assert pycri_dirs.stop() == 0
        for front in fronts:
            front.stop()
        basic.stop()
    log = pycri_dirs.log_text()
    assert "PullImage image" in log and "<redacted>" in log  # the debug lines are there
    assert "/cdn/v2/redirected/blobs/" in log  # and the redirect's, cut to its path
    assert "pycri_image_pulls_total" in scraped or "pycri_" in scraped
    for secret in (PASSWORD, WRONG, auth, SCOPE_TOKEN, IDENTITY, SIGNATURE):
        for where, text in (("log", log), ("errors", "\n".join(errors)),
                            ("metrics", scraped)):
            assert secret not in text, f"{secret} in the {where}"

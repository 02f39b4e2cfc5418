"""What an idle daemon does not use is imported on first use: not at start, and the
first use in a fresh interpreter still works (the registry client, a zstd layer, a
YAML CDI spec). Each check runs in its own interpreter, so nothing the test process
already imported can hide a broken lazy import."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parent.parent
LAZY = ("httpx", "zstandard", "zlib_ng", "yaml", "prometheus_client")


def _fresh(code: str) -> dict[str, object]:
    """Run `code` in a new interpreter after importing what `pycri serve` imports;
    it leaves its result in `out`. Returns out plus the lazy modules then loaded."""
    script = textwrap.dedent("""
        import json, sys
        import pycri.cli, pycri.daemon
        out = {"at_start": [m for m in LAZY if m in sys.modules]}
    """) + textwrap.dedent(code) + textwrap.dedent("""
        out["after"] = [m for m in LAZY if m in sys.modules]
        print(json.dumps(out))
    """)
    res = subprocess.run([sys.executable, "-c", f"LAZY = {LAZY!r}\n{script}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    result: dict[str, object] = json.loads(res.stdout.splitlines()[-1])
    return result


def test_serve_imports_none_of_them() -> None:
    assert _fresh("")["at_start"] == []


def test_registry_client_on_first_use() -> None:
    out = _fresh("""
        import asyncio, types
        from pycri.config import ImagesConfig
        from pycri.image.manager import ImageManager
        mgr = types.SimpleNamespace(_client=None, _cfg=ImagesConfig())
        client = ImageManager.client.fget(mgr)
        out["client"] = type(client).__name__
        asyncio.run(client.aclose())
    """)
    assert out["client"] == "RegistryClient"
    assert "httpx" in out["after"]  # type: ignore[operator]


def test_zstd_layer_on_first_use(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo("hello")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "blob").write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    (tmp_path / "tmp").mkdir()
    out = _fresh(f"""
        from pathlib import Path
        from pycri.image.unpack import unpack_layer
        tmp = Path({str(tmp_path)!r})
        unpack_layer(tmp / "blob", tmp / "layer", tmp / "tmp", None)
        out["content"] = (tmp / "layer" / "hello").read_text()
    """)
    assert out["content"] == "hi"
    assert {"zstandard", "zlib_ng"} <= set(out["after"])  # type: ignore[arg-type]


def test_yaml_cdi_spec_on_first_use() -> None:
    out = _fresh("""
        from pycri.cdi.registry import decode
        out["doc"] = decode("/etc/cdi/vendor.yaml", b"cdiVersion: 0.6.0\\nkind: a.b/c\\n")
    """)
    assert out["doc"] == {"cdiVersion": "0.6.0", "kind": "a.b/c"}
    assert "yaml" in out["after"]  # type: ignore[operator]


def test_metrics_endpoint_on_first_use() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = _fresh(f"""
        import urllib.request
        from pycri import metrics, metrics_listener
        metrics.RPC_ERRORS.labels("PullImage", "NOT_FOUND").inc()
        metrics.RPC_SECONDS.labels("Version").observe(0.002)
        out["before_serve"] = "prometheus_client" in sys.modules
        stop = metrics_listener.serve("127.0.0.1:{port}")
        with urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10) as r:
            out["text"] = r.read().decode()
        stop()
    """)
    assert out["before_serve"] is False
    text = str(out["text"])
    assert 'pycri_rpc_errors_total{code="NOT_FOUND",method="PullImage"} 1.0' in text
    assert 'pycri_rpc_duration_seconds_bucket{le="0.005",method="Version"} 1.0' in text
    assert 'pycri_rpc_duration_seconds_bucket{le="0.001",method="Version"} 0.0' in text
    assert "pycri_image_pull_bytes_total 0.0" in text  # an unlabelled one: there from the start
    assert "pycri_process_resident_memory_bytes" in text
    assert "prometheus_client" in out["after"]  # type: ignore[operator]

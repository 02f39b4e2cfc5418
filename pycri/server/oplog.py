"""The operator's log: one info line per CRI request that changes state.

It names what the request touched (pod and container IDs and names, the image), how
long it took and how it ended (the gRPC code, and the error's words on failure), so
`grep <id>` over the log tells a pod's story. Read-only calls (List*, *Status, *Stats,
Version, probes through ExecSync, streaming URLs) are not logged: they are the hot path
and say nothing about what happened. The fields go as `extra={"fields": ...}`, which the
JSON formatter (cli.py) turns into keys.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("pycri.rpc")

_READ_ONLY = frozenset({
    "Version", "Status", "RuntimeConfig", "ImageFsInfo", "ExecSync", "Exec", "Attach",
    "PortForward",
})  # fmt: skip


def changes_state(method: str) -> bool:
    """Whether calls of `method` get their line (anything not known to be read-only)."""
    return not (method.startswith("List") or method.endswith(("Status", "Stats"))
                or method in _READ_ONLY)  # fmt: skip


def subject(servicer: Any, request: Any) -> dict[str, str]:
    """What the request names, before the call (a removed record is gone afterwards)."""
    fields: dict[str, str] = {}
    sid = getattr(request, "pod_sandbox_id", "")
    cid = getattr(request, "container_id", "")
    if cid:
        fields["container_id"] = cid
        ctr = getattr(getattr(servicer, "containers", None), "containers", {}).get(cid)
        if ctr is not None:
            fields["container"] = ctr.config.metadata.name
            sid = sid or ctr.sandbox_id
    if sid:
        fields["pod_id"] = sid
        sb = getattr(getattr(servicer, "sandboxes", None), "sandboxes", {}).get(sid)
        if sb is not None:
            fields["pod"] = _pod_name(sb.config.metadata)
    config = getattr(request, "config", None)
    md = getattr(config, "metadata", None)
    if md is not None and md.name:
        if hasattr(md, "namespace"):  # PodSandboxMetadata
            fields["pod"] = _pod_name(md)
        else:
            fields["container"] = md.name
    image = getattr(getattr(request, "image", None), "image", None)  # an ImageSpec's ref
    if isinstance(image, str) and image:
        fields["image"] = image
    return fields


def done(method: str, fields: dict[str, str], response: Any, seconds: float, code: str,
         error: str = "") -> None:  # fmt: skip
    """Log the finished call: its subject, the IDs it made, duration and outcome."""
    for key, attr in (("pod_id", "pod_sandbox_id"), ("container_id", "container_id"),
                      ("image_ref", "image_ref")):  # fmt: skip
        value = getattr(response, attr, "")
        if value:
            fields[key] = value
    entry: dict[str, Any] = {"rpc": method, **fields, "duration_s": round(seconds, 6),
                             "outcome": code}  # fmt: skip
    if error:
        entry["error"] = error
    text = " ".join(f"{k}={_quote(v)}" for k, v in entry.items() if k != "rpc")
    log.info("%s %s", method, text, extra={"fields": entry})


def _pod_name(md: Any) -> str:
    return f"{md.namespace}/{md.name}"


def _quote(value: object) -> str:
    s = str(value)
    return repr(s) if not s or any(c.isspace() or c in "'\"=" for c in s) else s

"""What a stopped pycri under `work` left on the host, for hack/soak.py.

Each entry lists the leaked things of one kind; an empty report is a clean run.
Only what belongs to this daemon is counted (its work dir, the IDs it handed
out, its CNI network and bridge), since other daemons may run on the host.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path

_ID = re.compile(r"\b[0-9a-f]{64}\b")
# Images and their layers stay pulled on purpose; everything else has an owner that was removed.
_OWNED_KINDS = ("sandbox", "container", "snapshot")


def ids_in_log(log: Path) -> set[str]:
    """Every object ID the daemon ever logged (catches objects no client was told of)."""
    try:
        return set(_ID.findall(log.read_text(errors="replace")))
    except FileNotFoundError:
        return set()


def _entries(d: Path) -> list[str]:
    return sorted(str(p) for p in d.iterdir()) if d.is_dir() else []


def db_rows(db: Path) -> list[str]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(_OWNED_KINDS))
        rows = conn.execute(f"SELECT kind, id FROM records WHERE kind IN ({marks})",
                            _OWNED_KINDS).fetchall()
    finally:
        conn.close()
    return [f"{kind}/{rid}" for kind, rid in rows]


def image_store(root: Path) -> dict[str, list[str]]:
    """Blobs, unpacked layers and layer rows that no remaining image refers to, and
    downloads never finished (a kill mid-pull must not leave any of them for good)."""
    db = root / "pycri.db"
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        images = [json.loads(d) for (d,) in conn.execute(
            "SELECT data FROM records WHERE kind = 'image'")]
        layer_rows = [rid for (rid,) in conn.execute(
            "SELECT id FROM records WHERE kind = 'layer'")]
    finally:
        conn.close()
    blobs = {b.split(":", 1)[1] for img in images for b in img["blobs"]}
    chains = {c for img in images for c in img["chain_ids"]}
    on_disk = root / "content" / "blobs" / "sha256"
    return {
        "unreferenced_blobs": [str(p) for p in _paths(on_disk) if p.name not in blobs],
        "unreferenced_layers": [str(p) for p in _paths(root / "layers") if p.name not in chains],
        "unreferenced_layer_rows": [f"layer/{r}" for r in layer_rows if r not in chains],
        "unfinished_downloads": _entries(root / "content" / "ingest"),
    }


def _paths(d: Path) -> list[Path]:
    return sorted(d.iterdir()) if d.is_dir() else []


def iptables_rules(network: str, ids: set[str]) -> list[str]:
    found = []
    for table in ("nat", "filter"):
        out = subprocess.run(["iptables-save", "-t", table], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            if f'"{network}"' in line or ids & set(_ID.findall(line)):
                found.append(f"{table}: {line}")
    return found


def leftovers(work: Path, seen: set[str], network: str) -> dict[str, list[str]]:
    root, state = work / "root", work / "state"
    ids = seen | ids_in_log(work / "pycri.log")
    netns = [n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
             if n.removeprefix("pycri-") in ids]
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f if str(work) in line.split()[1]]
    conmon = subprocess.run(["pgrep", "-f", f"conmon.*{work}"], capture_output=True,
                            text=True).stdout.split()
    cgroups = [str(d) for d in Path("/sys/fs/cgroup").glob("*/pycri/pycri-*")
               if d.name.removeprefix("pycri-").split(".")[0] in ids]
    leases = [p.name for p in (work / "ipam").rglob("*") if p.name[:1].isdigit()]
    return {
        "netns": netns,
        "ip_leases": leases,
        "mounts": mounts,
        "conmon": conmon,
        "cgroups": cgroups,
        "iptables": iptables_rules(network, ids),
        "db_rows": db_rows(root / "pycri.db"),
        "bundles": _entries(state / "bundles"),
        "exit_files": _entries(state / "exits"),
        "exec_dirs": _entries(state / "exec"),
        "runtime_state": _entries(state / "runc") + _entries(state / "crun"),
        "partial_downloads": _entries(root / "tmp"),
        "snapshots": _entries(root / "snapshots"),
        "pod_dirs": _entries(root / "sandboxes") + _entries(state / "sandboxes"),
        "cni_cache": _entries(root / "cni-cache"),
        "rro": _entries(state / "rro"),
    } | image_store(root)

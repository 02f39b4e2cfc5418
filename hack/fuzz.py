#!/usr/bin/env python3
"""Structured CRI fuzzing: long runs outside CI (tests/e2e/test_fuzz.py is the short one).

Starts its own registry (busybox test image on 127.0.0.1), its own `pycri serve` on a
private root/state/socket with its own CNI bridge, then sends `--requests` generated
requests (tests/lib/fuzz.py) in batches, checking after each batch that the daemon
answers Version within 1 s. At the end it removes everything and checks for leaks
(netns, mounts, conmon, cgroups, IP leases, DB rows, canary files). Prints counts per
RPC and status code, and each finding with its reproducer; exit status 1 if any.

    PYTHONPATH=$PWD .venv/bin/python hack/fuzz.py --requests 100000 --out /var/tmp/fuzz

The other doors (CDI spec files, config files, the metrics listener) are fuzzed by
tests/test_doors.py; a long run: PYCRI_FUZZ_EXAMPLES=100000 .venv/bin/pytest
tests/test_doors.py -k generated
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.lib import fuzz, images
from tests.lib.registry import Registry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=200, help="requests between liveness checks")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1,
                    help="client processes fuzzing the one daemon at once")
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/fuzz"),
                    help="work dir parent; the report is written there too")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.out))
    work.chmod(0o755)
    reg = Registry(work / "registry")
    reg.start()
    octet = 100 + secrets.randbelow(100)
    bridge = f"pcfz{secrets.token_hex(3)}"
    node = None
    try:
        image = images.push_busybox(reg.addr, work / "layout", name="fuzz/busybox")
        node = fuzz.start_node(work / "node", image, reg.addr, bridge, f"10.197.{octet}.0/24")
        fz = fuzz.Fuzzer(node.proc, node.pool, node.ipam, f"e2e-{node.bridge}")
        started = time.monotonic()

        def progress(f: fuzz.Fuzzer) -> None:
            rate = f.sent / max(time.monotonic() - started, 1e-3)
            print(f"{time.strftime('%H:%M:%S')} sent {f.sent} ({rate:.1f}/s), findings "
                  f"{len(f.findings)}, pods {len(f.pool.pods)}, restarts {f.restarts}",
                  flush=True)

        if args.workers > 1:
            problems = fuzz.run_parallel(fz, args.workers, args.requests, args.batch, args.seed)
        else:
            problems = fuzz.run(fz, args.requests, args.batch, args.seed, progress)
        fz.remove_all()
        leaks = fz.leaks(work / "node")
        report = fz.report()
        summary = {"requests": fz.sent, "seconds": round(fz.elapsed, 1),
                   "findings": len(fz.findings), "liveness": problems,
                   "leaks": {k: v for k, v in leaks.items() if v}, "restarts": fz.restarts}
        text = f"{report}\nliveness problems: {problems}\nleaks: {summary['leaks']}\n"
        print(text)
        (args.out / f"report-{work.name}.txt").write_text(text)
        (args.out / f"summary-{work.name}.json").write_text(json.dumps(summary, indent=1))
        fz.channel.close()
        return 1 if (fz.findings or problems or summary["leaks"]) else 0
    finally:
        if node is not None:
            status = fuzz.stop_node(node, work / "node")
            print(f"pycri serve exited {status}")
        reg.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(work / "registry", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Driver for an OCI runtime CLI (runc or crun), one instance per runtime handler.

Every call passes `--root` so that each handler keeps its own state directory and
pycri never sees containers it did not create. Calls that target something already
gone succeed (kill, delete), because the CRI wants Stop/Remove to be idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal as _signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pycri import metrics, procs
from pycri.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PycriError,
)

DEFAULT_TIMEOUT = 60.0

# crun 1.8 refuses hybrid cgroups while any controller (here: hugetlb) sits on v2.
_HYBRID_REFUSAL = "cgroups in hybrid mode not supported"
_LOGRUS_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_VALID_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


def check_id(cid: str) -> None:
    """Reject IDs that could escape the runtime root or confuse the CLI."""
    if not _VALID_ID.match(cid):
        raise InvalidArgument(f"container id {cid!r} is not a valid runtime id")


class OCIRuntimeError(PycriError):
    """The runtime CLI failed; the message carries its own words on one line."""

    def __init__(self, runtime: str, action: str, cid: str, message: str) -> None:
        super().__init__(f"{runtime} {action} {cid}: {message}")
        self.runtime = runtime
        self.action = action
        self.cid = cid
        self.detail = message


def one_line(output: bytes | str) -> str:
    """Reduce runtime stderr (logrus text, JSON log lines or plain text) to one line."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    parts: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        msg = _message_of(line)
        if msg and msg not in parts:
            parts.append(msg)
    return "; ".join(parts) or "(no error output)"


def _message_of(line: str) -> str:
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict) and "msg" in obj:
                return str(obj["msg"])
    m = _LOGRUS_MSG.search(line)
    if m:
        return m.group(1).replace('\\"', '"').replace("\\\\", "\\")
    return line


def runtime_failure(runtime: str, action: str, cid: str, stderr: bytes | str) -> PycriError:
    """The domain error for a failed runtime call (shared with the conmon driver)."""
    msg = one_line(stderr)
    if _HYBRID_REFUSAL in msg:
        return FailedPrecondition(
            f"{runtime} {action} {cid}: {runtime} refuses this host's hybrid cgroup layout "
            f"({msg}); a controller (usually hugetlb) is bound to the cgroup v2 hierarchy. "
            "Bind it to v1 (mkdir -p /sys/fs/cgroup/hugetlb && "
            "mount -t cgroup -o hugetlb none /sys/fs/cgroup/hugetlb) or use runc"
        )
    if action in ("create", "exec") and any(m in msg for m in _UNRUNNABLE):
        # The command names nothing the image can run: the request is at fault.
        return InvalidArgument(f"{runtime} {action} {cid}: the command cannot be run in "
                               f"the container: {msg}")
    if action == "exec" and any(m in msg for m in _EXITED_DURING_EXEC):
        # It exited between pycri's state check and the runtime's.
        return FailedPrecondition(f"{runtime} exec {cid}: the container is not running")
    if action in ("create", "update") and any(m in msg for m in _CGROUP_REFUSALS):
        # The kernel refused a requested limit (a cpuset beyond the node's CPUs, memory
        # below what the container already uses): the request's values are at fault.
        return InvalidArgument(f"{runtime} {action} {cid}: the kernel refused the "
                               f"container's resources: {msg}")
    return OCIRuntimeError(runtime, action, cid, msg)


# runc: 'unable to start container process: exec: "x": …'; crun: 'executable file `x` …'.
# The container went away between pycri's state check and the runtime joining it.
_EXITED_DURING_EXEC = ("cannot exec in a stopped container", "error executing setns process")
_UNRUNNABLE = ("unable to start container process: exec: ", "executable file not found",
               "executable file `")
_CGROUP_REFUSALS = ("error setting cgroup config", "unable to apply cgroup configuration",
                    "Setting back cgroup configs failed",
                    "unable to set memory limit",
                    "container init was OOM-killed")  # runc: a limit too low to start in


class OCIRuntime:
    """Async wrapper of one runtime binary with its own state root."""

    def __init__(self, name: str, path: str, root: Path, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.name = name
        self.path = path
        self.root = Path(root)
        self.timeout = timeout

    @property
    def global_args(self) -> list[str]:
        """Arguments every invocation needs (also handed to conmon as --runtime-arg)."""
        return ["--root", str(self.root)]

    async def run(
        self, args: Sequence[str], stdin: bytes | None = None, timeout: float | None = None,
        options: Sequence[str] = (),
    ) -> tuple[int, bytes, bytes]:
        """Run `<runtime> --root R [options] args...`; a hung runtime is killed at the deadline.

        The runtime runs in its own process group and the whole group is killed: a
        child left holding the output pipes would keep `wait()` from ever returning.
        """
        limit = self.timeout if timeout is None else timeout
        action = args[0] if args else ""
        try:
            with metrics.timed(metrics.RUNTIME_SECONDS.labels(self.name, action),
                               metrics.RUNTIME_ERRORS.labels(self.name, action)):  # fmt: skip
                rc, out, err = await procs.run([self.path, *self.global_args, *options, *args],
                                               stdin=stdin, timeout=limit)  # fmt: skip
                if rc != 0:
                    metrics.RUNTIME_ERRORS.labels(self.name, action).inc()
                return rc, out, err
        except TimeoutError:
            raise DeadlineExceeded(
                f"{self.name} {' '.join(args)}: no answer within {limit:g}s, killed "
                f"(the limit is runtimes.{self.name}.timeout)"
            ) from None
        except procs.OutputTooLarge as e:
            raise OCIRuntimeError(self.name, action, args[-1] if len(args) > 1 else "",
                                  str(e)) from None

    def _absent(self, cid: str) -> bool:
        """Both runc and crun keep one directory per container under the root."""
        return not (self.root / cid).exists()

    async def state(self, cid: str) -> dict[str, Any] | None:
        """The runtime's state JSON, or None when it does not know `cid`."""
        check_id(cid)
        rc, out, err = await self.run(["state", cid])
        if rc != 0:
            if self._absent(cid):
                return None
            raise runtime_failure(self.name, "state", cid, err)
        try:
            result: dict[str, Any] = json.loads(out)
        except ValueError:
            bad = f"unreadable output {out[:200]!r}"
            raise OCIRuntimeError(self.name, "state", cid, bad) from None
        return result

    async def start(self, cid: str) -> None:
        """Run the user process of a created container."""
        await self._act("start", cid)

    async def _act(self, action: str, cid: str) -> None:
        """`<runtime> action cid`: NotFound if the runtime does not know the container."""
        check_id(cid)
        rc, _, err = await self.run([action, cid])
        if rc != 0:
            if self._absent(cid):
                raise NotFound(f"{self.name} {action} {cid}: the runtime does not know it")
            raise runtime_failure(self.name, action, cid, err)

    async def kill(self, cid: str, sig: int = _signal.SIGTERM, all_processes: bool = False) -> None:
        """Signal the container; a container already stopped or gone is not an error."""
        check_id(cid)
        args = ["kill"]
        if all_processes:
            args.append("--all")
        args += [cid, str(int(sig))]
        rc, _, err = await self.run(args)
        if rc == 0:
            return
        st = await self.state(cid)
        if st is None or st.get("status") == "stopped":
            return
        raise runtime_failure(self.name, "kill", cid, err)

    async def delete(self, cid: str, force: bool = False) -> None:
        """Forget the container (force: kill it first); absent counts as deleted."""
        check_id(cid)
        args = ["delete"]
        if force:
            args.append("--force")
        rc, _, err = await self.run([*args, cid])
        if rc != 0 and not self._absent(cid):
            raise runtime_failure(self.name, "delete", cid, err)

    async def update(self, cid: str, resources: dict[str, Any]) -> None:
        """Apply OCI LinuxResources JSON; /dev/stdin works for both runc and crun."""
        check_id(cid)
        data = json.dumps(resources).encode()
        rc, _, err = await self.run(["update", "--resources", "/dev/stdin", cid], stdin=data)
        if rc != 0:
            if self._absent(cid):
                raise NotFound(f"{self.name} update {cid}: the runtime does not know it")
            st = await self.state(cid)  # it may have exited before its exit file was read
            if st is not None and st.get("status") == "stopped":
                raise FailedPrecondition(f"{self.name} update {cid}: the container is not running")
            raise runtime_failure(self.name, "update", cid, err)

    async def pause(self, cid: str, resume: bool = False) -> None:
        """Freeze every process of the container (its cgroup's freezer), or thaw them."""
        await self._act("resume" if resume else "pause", cid)

    def criu_options(self, criu: str) -> list[str]:
        """Global options naming the criu binary: runc takes `--criu`; crun links libcriu
        and has no such option."""
        return ["--criu", criu] if os.path.basename(self.path).startswith("runc") else []

    async def checkpoint(
        self, cid: str, image_path: Path, work_path: Path, criu: str, timeout: float
    ) -> None:
        """Dump the container's processes with CRIU into `image_path`, leaving them as
        they were (running, or paused: CRIU then keeps the cgroup frozen); CRIU's log goes
        to `work_path`/dump.log, whose errors the failure names."""
        check_id(cid)
        args = ["checkpoint", "--image-path", str(image_path), "--work-path", str(work_path),
                "--leave-running", cid]
        rc, _, err = await self.run(args, timeout=timeout, options=self.criu_options(criu))
        if rc != 0:
            if self._absent(cid):
                raise NotFound(f"{self.name} checkpoint {cid}: the runtime does not know it")
            raise OCIRuntimeError(self.name, "checkpoint", cid,
                                  f"{one_line(err)}{criu_errors(work_path / 'dump.log')}")


def criu_errors(log: Path, limit: int = 5) -> str:
    """The last `Error` lines of a CRIU log, to say why a dump or restore failed."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (256 << 10)))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.split("): ", 1)[-1].strip() for line in lines if "Error" in line]
    return f" (CRIU: {'; '.join(errors[-limit:])})" if errors else ""

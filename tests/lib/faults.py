"""Fault injectors for the fault-injection suite (tests/e2e/test_faults.py).

`HangingRuntime` is an OCI runtime handler that is real runc, except that the
subcommands switched on with `hang("start")` never answer: the wrapper starts a
child (`sleep`) that keeps its output pipes open and waits, the way a wedged
runtime holding a lock would; with `hang("create", after=True)` the real runtime
does its work first (cgroup, runtime state, `runc init`) and only then hangs.
Every pid that hung is recorded, so a test can check that pycri killed them all.

`failing_plugin` and `HangingRuntime.fail` fail a CNI ADD or a runtime call once a
given file exists: so a test can have one fail while the other is known to be in flight.

`DroppingProxy` forwards loopback TCP connections to a registry and cuts each one
after a given number of response bytes (the registry "dies" mid-pull), so the
shared registry fixture itself is never disturbed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_SUBCOMMAND = """sub=""
skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in
    --root|--log|--log-format|--criu) skip=1 ;;
    -*) ;;
    *) sub="$a"; break ;;
  esac
done
"""


def runtime_wrapper(what: str, body: str) -> str:
    """A shell OCI runtime that does `body` (which must end by running the real runtime
    with "$@") with the subcommand pycri called in $sub, global options skipped."""
    return f"#!/bin/sh\n# {what}\n{_SUBCOMMAND}{body}"


_HANG = """touch "{dir}/entered-$sub"
if [ -e "{dir}/fail-$sub" ]; then
  # Fail once the file named inside exists (at most 30 s later), as a refusing runtime.
  wait_for=$(cat "{dir}/fail-$sub"); n=0
  while [ -n "$wait_for" ] && [ ! -e "$wait_for" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done
  echo "injected $sub failure" >&2
  exit 1
fi
if [ -e "{dir}/hang-$sub" ]; then
  sleep 3600 &
  echo "$$ $!" >> "{dir}/hung"
  wait
fi
if [ -e "{dir}/hang-after-$sub" ]; then
  {runtime} "$@"
  eval "echo \\${{$#}}" >> "{dir}/done-before-hang"
  sleep 3600 &
  echo "$$ $!" >> "{dir}/hung"
  wait
fi
exec {runtime} "$@"
"""


class HangingRuntime:
    """A wrapper runtime script in `workdir`; switches are files next to it."""

    def __init__(self, workdir: Path, runtime: str = "/usr/sbin/runc") -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "runtime"
        self.path.write_text(runtime_wrapper(
            f"A fault-injecting OCI runtime: real {runtime}, unless {self.dir}/hang-<subcommand>"
            " or fail-<subcommand> exists; entered-<subcommand> says a call began.",
            _HANG.format(dir=self.dir, runtime=runtime)))
        self.path.chmod(0o755)

    def hang(self, subcommand: str, after: bool = False) -> None:
        (self.dir / (f"hang-after-{subcommand}" if after else f"hang-{subcommand}")).touch()

    def fail(self, subcommand: str, once: Path | None = None) -> None:
        """Make `subcommand` fail (exit 1, "injected <subcommand> failure" on stderr),
        once `once` exists if given (waiting at most 30 s for it)."""
        (self.dir / f"fail-{subcommand}").write_text(str(once) if once else "")

    def entered(self, subcommand: str) -> Path:
        """The file that appears when a `subcommand` call begins."""
        return self.dir / f"entered-{subcommand}"

    def release(self, subcommand: str | None = None) -> None:
        """Stop hanging or failing `subcommand` (or every one)."""
        sub = subcommand or "*"
        for f in [*self.dir.glob(f"hang-{sub}"), *self.dir.glob(f"hang-after-{sub}"),
                  *self.dir.glob(f"fail-{sub}")]:
            f.unlink(missing_ok=True)

    def done_before_hang(self) -> list[str]:
        """The last argument (the container id) of each call that hung after its work."""
        done = self.dir / "done-before-hang"
        return done.read_text().split() if done.exists() else []

    def hung_pids(self) -> list[int]:
        """Every process that ever hung (wrapper shells and their sleeping children)."""
        hung = self.dir / "hung"
        text = hung.read_text() if hung.exists() else ""
        return [int(p) for p in text.split()]

    def left(self, wait: float = 30.0) -> list[int]:
        """The hung processes still there (running, or zombies nobody reaped) once
        `wait` seconds have passed or all are gone."""
        return wait_gone(self.hung_pids(), wait)

    def kill_all(self) -> None:
        """Safety net for a failed test: end the hung processes, by pid."""
        for pid in wait_gone(self.hung_pids(), 0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


@contextlib.contextmanager
def hang_handler(config: Path, workdir: Path, state: Path,
                 timeout: float) -> Iterator[HangingRuntime]:
    """Runtime handler "hang" (a HangingRuntime in `workdir`, each call limited to
    `timeout` s) added to the daemon config `config`; restarting the daemon loads it.
    Afterwards every switch is lifted, what hung is killed and the runtime state the
    handler kept (under `state`/hang) is deleted."""
    rt = HangingRuntime(workdir)
    config.write_text(config.read_text()
                      + f'[runtimes.hang]\npath = "{rt.path}"\ntimeout = {timeout}\n')
    try:
        yield rt
    finally:
        rt.release()
        rt.kill_all()
        root = state / "hang"
        for d in root.glob("*") if root.exists() else []:
            subprocess.run(["runc", "--root", str(root), "delete", "--force", d.name],
                           capture_output=True)


def wait_gone(pids: list[int], wait: float) -> list[int]:
    """The `pids` still in /proc (alive or zombie) after up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while (left := [p for p in pids if os.path.exists(f"/proc/{p}")]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    return left


def hanging_plugin(hang_on: str, pidfile: Path) -> str:
    """A chained CNI plugin script that passes prevResult through, but on `hang_on`
    (ADD/DEL) starts a child that holds stdout and never answers; pids go to `pidfile`."""
    return (
        "#!/bin/sh\n"
        f'if [ "$CNI_COMMAND" = {hang_on} ]; then\n'
        "  sleep 3600 &\n"
        f'  echo "$$ $!" >> {pidfile}\n'
        "  wait\n"
        "fi\n"
        'if [ "$CNI_COMMAND" = ADD ]; then\n'
        "  exec python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)"
        "[\"prevResult\"]))'\n"
        "fi\n"
    )


def failing_plugin(once: Path) -> str:
    """A chained CNI plugin script whose ADD fails (CNI error code 7, "injected ADD
    failure") once `once` exists (waiting at most 30 s for it); DEL succeeds."""
    return (
        "#!/bin/sh\n"
        'if [ "$CNI_COMMAND" = ADD ]; then\n'
        f"  n=0; while [ ! -e {once} ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done\n"
        """  echo '{"cniVersion":"1.0.0","code":7,"msg":"injected ADD failure"}'\n"""
        "  exit 1\n"
        "fi\n"
    )


class DroppingProxy:
    """127.0.0.1 proxy to `target` that closes each connection after `limit` bytes
    from the target (`limit` may be changed at any time; None forwards everything)."""

    def __init__(self, target: str, limit: int | None) -> None:
        self.target = target
        self.limit = limit
        self.dropped = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._srv.getsockname()[1]}"
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        host, port = self.target.rsplit(":", 1)
        with client, socket.create_connection((host, int(port))) as upstream:
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            sent = 0
            while True:
                try:
                    data = upstream.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                if self.limit is not None and sent + len(data) >= self.limit:
                    with contextlib.suppress(OSError):
                        client.sendall(data[: self.limit - sent])
                    self.dropped += 1
                    # RST, not FIN: the peer sees the connection die, not a clean end.
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                try:
                    client.sendall(data)
                except OSError:
                    return
                sent += len(data)

    def close(self) -> None:
        self._closing = True
        self._srv.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)

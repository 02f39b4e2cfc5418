"""Can this host checkpoint and restore? CRIU and the runtime are asked once, then remembered.

CRIU works only where the kernel has the features it needs and it understands the
kernel's memory layout (CRIU 3.17 refuses kernels whose vDSO area it does not know),
and the OCI runtime drives it only if it was built with it (crun may not be). Asking
`criu check` costs a process and can take seconds, so the answer is cached for the
daemon's life; the probes run as async subprocesses, never on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from pycri.config import CheckpointConfig, Config
from pycri.errors import FailedPrecondition
from pycri.procs import communicate

MAX_REASON = 600  # characters of CRIU's own words kept in an error message


def is_checkpoint_archive(image: str) -> bool:
    """CreateContainer names a checkpoint archive by its path, as CRI-O does: an image
    reference never starts with '/'."""
    return image.startswith("/")


@dataclass(frozen=True)
class Probe:
    """One probe's answer: `problem` is None when the part works, else what is missing."""

    problem: str | None
    detail: str = ""  # what was found (a version line), for `pycri check`
    # False for an answer that may change by itself (no answer in time on a busy host):
    # it is reported, not remembered, and the next call asks again.
    lasting: bool = True


async def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    """Exit status and output (stdout then stderr) of a short probe command."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = await communicate(proc, None, timeout)
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode(errors="replace")


def _reason(output: str) -> str:
    """CRIU's error lines without their source locations, cut to a readable length."""
    lines = [line.split("): ", 1)[-1].strip() for line in output.splitlines()
             if line.startswith("Error") or "error" in line.lower()]
    text = "; ".join(dict.fromkeys(lines)) or output.strip() or "no output"
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "…"


async def probe_criu(cfg: CheckpointConfig) -> Probe:
    """Is `cfg.criu` there, and does `criu check` accept this kernel?"""
    path = cfg.criu
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return Probe(f"the criu binary {path} is not there (apt-get install criu, or set "
                     "checkpoint.criu)")
    try:
        _, version = await _run([path, "--version"], cfg.check_timeout)
        code, output = await _run([path, "check"], cfg.check_timeout)
    except TimeoutError:
        return Probe(f"`{path} check` did not answer within {cfg.check_timeout:g}s",
                     lasting=False)
    except OSError as e:
        return Probe(f"{path} cannot be run: {e}")
    found = f"criu {' '.join(version.replace('Version:', '').split())}"
    if code != 0:
        return Probe(f"`{path} check` fails on this host ({found}): {_reason(output)}", found)
    return Probe(None, found)


async def probe_runtime(name: str, path: str, timeout: float) -> Probe:
    """Can the runtime handler's binary checkpoint? crun says so with +CRIU in --version;
    a runtime without a `checkpoint` command fails its help."""
    try:
        _, version = await _run([path, "--version"], timeout)
        first = version.splitlines()[0] if version.strip() else path
        if version.startswith("crun") and "+CRIU" not in version:
            return Probe(f"runtime handler {name!r} ({first}) was built without CRIU "
                         "(no +CRIU in `crun --version`)", first)
        code, output = await _run([path, "checkpoint", "--help"], timeout)
    except TimeoutError:
        return Probe(f"runtime handler {name!r} ({path}) did not answer within {timeout:g}s",
                     lasting=False)
    except OSError as e:
        return Probe(f"runtime handler {name!r} ({path}) cannot be run: {e}")
    if code != 0:
        return Probe(f"runtime handler {name!r} ({first}) has no checkpoint command: "
                     f"{_reason(output)}", first)
    return Probe(None, first)


class CheckpointSupport:
    """The cached answers; `require` raises FailedPrecondition naming every missing part."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._probes: dict[str, asyncio.Task[Probe]] = {}  # "criu" or a handler name

    def forget(self) -> None:
        """Drop the cached answers (a reload changed [checkpoint] or the handlers): the
        next request probes again with the new settings."""
        self._probes = {}

    def _probe(self, key: str) -> asyncio.Task[Probe]:
        """The probe's task, started on first use; concurrent callers share it."""
        task = self._probes.get(key)
        if task is None:
            c = self.cfg.checkpoint
            coro = (probe_criu(c) if key == "criu" else
                    probe_runtime(key, self.cfg.runtimes[key].path, c.check_timeout))
            task = self._probes[key] = asyncio.ensure_future(coro)
        return task

    async def require(self, handler: str) -> None:
        """Return if containers of `handler` can be checkpointed and restored here."""
        keys = ["criu"] + ([handler] if handler in self.cfg.runtimes else [])
        probes = []
        for key in keys:
            try:
                probe = await asyncio.shield(self._probe(key))
            except Exception:
                self._probes.pop(key, None)  # an unexpected failure is not an answer to keep
                raise
            if not probe.lasting:
                self._probes.pop(key, None)
            probes.append(probe)
        problems = [p.problem for p in probes if p.problem]
        if problems:
            raise FailedPrecondition("checkpoint/restore cannot work on this node: "
                                     + "; ".join(problems))

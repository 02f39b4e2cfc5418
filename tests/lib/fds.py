"""Counting this process's open file descriptors for leak checks."""

from __future__ import annotations

import gc
import os


def open_fds() -> set[str]:
    """The fds open now, after a collection: an object an earlier test dropped in a
    reference cycle closes its fd here, not in the middle of the next test's count."""
    gc.collect()
    return {fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")}


def new_fds(before: set[str]) -> set[str]:
    """The fds opened since `before` and still open; one that closed meanwhile is no leak."""
    return open_fds() - before

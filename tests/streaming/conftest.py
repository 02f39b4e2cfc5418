"""Streaming tests reuse the real e2e node (registry, busybox image, own CNI network)."""

from tests.e2e.conftest import busybox, node, registry  # noqa: F401

"""The container manager's tests run on the real e2e node (registry, busybox image, own
CNI network); its fixtures are imported here so pytest sees them in this directory."""

from tests.e2e.conftest import busybox, node, registry  # noqa: F401

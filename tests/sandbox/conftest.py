"""The e2e node (a real pycri with its own CNI network) for the sandbox tests that need
one; the tests on pure helpers here need none."""

from tests.e2e.conftest import busybox, node, registry  # noqa: F401

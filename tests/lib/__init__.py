"""Helpers shared by pycri's test suites: a real local registry and test images."""

"""pycri: a Kubernetes CRI container runtime written in Python."""

__version__ = "0.1.0"

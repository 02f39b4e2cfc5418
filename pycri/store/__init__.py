"""Persistent metadata with an in-memory read index."""

from pycri.store.db import Record, Store

__all__ = ["Record", "Store"]

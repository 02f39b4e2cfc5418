"""Container lifecycle: create, start, stop, remove, status, list, update, exec, logs.

ContainerManager is composed of one mixin per story over ContainerBase (base.py: the
record index, the store and the parts it drives), so mypy checks each against the
shared attributes: create.py (the create pipeline, undone step by step on failure),
lifecycle.py (start, stop, remove, and exits), queries.py (list, status info,
updates, ExecSync, log reopening), recovery.py (reload and recheck after a restart);
ocispec.py reads what the spec is made from, signals.py converts stop signals.
"""

from __future__ import annotations

from pycri.container.create import ContainerCreate
from pycri.container.lifecycle import ContainerLifecycle
from pycri.container.queries import ContainerQueries
from pycri.container.recovery import ContainerRecovery


class ContainerManager(
    ContainerCreate, ContainerQueries, ContainerRecovery, ContainerLifecycle
):
    """Every container of the node; recovery acts through the lifecycle's exit and
    removal paths, so it builds on ContainerLifecycle."""

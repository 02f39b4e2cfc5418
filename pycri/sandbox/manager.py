"""Pod sandbox lifecycle: RunPodSandbox, StopPodSandbox, RemovePodSandbox, status, list.

A sandbox is the pod's network namespace (wired by CNI), its shared files
(hostname, hosts, resolv.conf, /dev/shm) and an infra process that holds the
IPC/UTS/PID namespaces. The manager is composed of one module per story over the
shared state of base.py: run.py (RunPodSandbox and its undo), infra.py (the infra
process), teardown.py (stop, remove), resize.py (UpdatePodSandboxResources),
queries.py (list, verbose status), recovery.py (exits, restart); network.py builds
the CNI arguments and host.py reads what the daemon may hand on to a pod.
"""

from __future__ import annotations

from pycri.sandbox.queries import Queries
from pycri.sandbox.recovery import Recovery
from pycri.sandbox.resize import Resize
from pycri.sandbox.run import RunPipeline
from pycri.sandbox.teardown import Teardown


class SandboxManager(RunPipeline, Teardown, Resize, Queries, Recovery):
    """The sandbox lifecycle: each mixin one story, all over SandboxBase's state."""

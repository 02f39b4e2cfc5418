"""What NRI needs of the CRI side, as an interface the container manager implements.

Plugins' `ContainerUpdate`s change running containers' resources; NRI reaches them
through this one method instead of importing the container manager, so nri/ stays
below the managers that call it (the seam containerd's NRI domain interface draws).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pycri.api import api_pb2 as pb

ResourceChange = Callable[[pb.LinuxContainerResources], pb.LinuxContainerResources]


class Containers(Protocol):
    async def change_resources(self, cid: str, change: ResourceChange) -> None:
        """Set a running container's resources to `change(its recorded resources)`,
        atomically; NotFound or FailedPrecondition when it is gone or not running."""

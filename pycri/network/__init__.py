"""Pod networking: pinned network namespaces and CNI plugin execution."""

from pycri.network.cni import (
    DNS,
    Bandwidth,
    CNIManager,
    CNIPluginError,
    NetworkResult,
    NetworkStatus,
    PodNetwork,
    PortMapping,
)
from pycri.network.netns import create_netns, list_netns, remove_netns

__all__ = [
    "DNS",
    "Bandwidth",
    "CNIManager",
    "CNIPluginError",
    "NetworkResult",
    "NetworkStatus",
    "PodNetwork",
    "PortMapping",
    "create_netns",
    "list_netns",
    "remove_netns",
]

"""runtime.v1.RuntimeService: CRI messages in, domain calls, CRI messages out."""

from __future__ import annotations

import grpc

from pycri import __version__
from pycri.api import api_pb2 as pb
from pycri.api import api_pb2_grpc as pb_grpc
from pycri.checkpoint.manager import CheckpointManager
from pycri.container.manager import ContainerManager
from pycri.sandbox.manager import SandboxManager
from pycri.server.checkpoint_rpcs import CheckpointRPCs
from pycri.server.container_rpcs import ContainerRPCs
from pycri.server.errors import rpc
from pycri.server.event_rpcs import EventRPCs
from pycri.server.metrics_rpcs import MetricsRPCs
from pycri.server.sandbox_rpcs import SandboxRPCs
from pycri.server.stats_rpcs import StatsRPCs
from pycri.server.streaming_rpcs import StreamingRPCs
from pycri.server.unimplemented import complete
from pycri.stats.collector import StatsCollector
from pycri.status import KUBE_API_VERSION, RUNTIME_API_VERSION, RUNTIME_NAME, NodeStatus
from pycri.streaming import StreamingServer

Ctx = grpc.aio.ServicerContext


@complete("runtime.v1.RuntimeService", pb_grpc.RuntimeServiceServicer)
class RuntimeServicer(
    SandboxRPCs,
    ContainerRPCs,
    StatsRPCs,
    StreamingRPCs,
    EventRPCs,
    MetricsRPCs,
    CheckpointRPCs,
    pb_grpc.RuntimeServiceServicer,
):
    """Node-level RPCs here; pod and container RPCs come from their own modules."""

    def __init__(
        self,
        node: NodeStatus,
        sandboxes: SandboxManager,
        containers: ContainerManager,
        streaming: StreamingServer,
    ) -> None:
        self.node = node
        self.sandboxes = sandboxes
        self.containers = containers
        self.stats = StatsCollector(sandboxes, containers)
        self.streaming = streaming
        self.list_chunks = node.cfg.lists  # how the Stream* lists cut their answer
        self.checkpoints = CheckpointManager(containers, sandboxes, containers.checkpoint_support)

    @rpc
    async def Version(self, request: pb.VersionRequest, context: Ctx) -> pb.VersionResponse:
        return pb.VersionResponse(
            version=KUBE_API_VERSION,
            runtime_name=RUNTIME_NAME,
            runtime_version=__version__,
            runtime_api_version=RUNTIME_API_VERSION,
        )

    @rpc
    async def Status(self, request: pb.StatusRequest, context: Ctx) -> pb.StatusResponse:
        conditions = [
            pb.RuntimeCondition(type=c.type, status=c.status, reason=c.reason, message=c.message)
            for c in self.node.conditions()
        ]
        return pb.StatusResponse(
            status=pb.RuntimeStatus(conditions=conditions),
            info=self.node.verbose_info() if request.verbose else {},
            runtime_handlers=[
                pb.RuntimeHandler(
                    name=name,
                    features=pb.RuntimeHandlerFeatures(
                        recursive_read_only_mounts=self.node.recursive_read_only,
                        user_namespaces=self.node.user_namespaces[name],
                    ),
                )
                for name in self.node.handlers()
            ],
            # mount_options: every handler remounts a bind with its flags (oci/bindopts.py).
            # user_namespaces_host_network: a pod's own user namespace owns its netns, so
            # the host's network cannot be combined with one (the gate refuses it).
            features=pb.RuntimeFeatures(supplemental_groups_policy=True, mount_options=True,
                                        user_namespaces_host_network=False),
        )

    @rpc
    async def RuntimeConfig(
        self, request: pb.RuntimeConfigRequest, context: Ctx
    ) -> pb.RuntimeConfigResponse:
        driver = pb.SYSTEMD if self.node.cfg.cgroup_driver == "systemd" else pb.CGROUPFS
        return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))

    @rpc
    async def UpdateRuntimeConfig(
        self, request: pb.UpdateRuntimeConfigRequest, context: Ctx
    ) -> pb.UpdateRuntimeConfigResponse:
        self.node.update_pod_cidr(request.runtime_config.network_config.pod_cidr)
        return pb.UpdateRuntimeConfigResponse()

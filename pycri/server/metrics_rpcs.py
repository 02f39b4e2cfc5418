"""RuntimeService metrics RPCs: cAdvisor-named samples as CRI Metric messages."""

from __future__ import annotations

import grpc

from pycri.api import api_pb2 as pb
from pycri.server.errors import rpc
from pycri.server.streamed import streamed_list
from pycri.stats.collector import StatsCollector
from pycri.stats.metrics import COUNTER, DESCRIPTORS, PodMetrics, Sample

Ctx = grpc.aio.ServicerContext


def _metric(s: Sample) -> pb.Metric:
    return pb.Metric(
        name=s.name,
        timestamp=s.timestamp,
        metric_type=pb.COUNTER if s.kind == COUNTER else pb.GAUGE,
        label_values=s.labels,
        value=pb.UInt64Value(value=s.value),
    )


def pod_metrics(p: PodMetrics) -> pb.PodSandboxMetrics:
    return pb.PodSandboxMetrics(
        pod_sandbox_id=p.sandbox_id,
        metrics=[_metric(s) for s in p.samples],
        container_metrics=[
            pb.ContainerMetrics(container_id=c.container_id,
                                metrics=[_metric(s) for s in c.samples])
            for c in p.containers
        ],
    )


class MetricsRPCs:
    stats: StatsCollector

    @rpc
    async def ListMetricDescriptors(
        self, request: pb.ListMetricDescriptorsRequest, context: Ctx
    ) -> pb.ListMetricDescriptorsResponse:
        return pb.ListMetricDescriptorsResponse(descriptors=[
            pb.MetricDescriptor(name=d.name, help=d.help, label_keys=d.label_keys)
            for d in DESCRIPTORS
        ])

    @rpc
    async def ListPodSandboxMetrics(
        self, request: pb.ListPodSandboxMetricsRequest, context: Ctx
    ) -> pb.ListPodSandboxMetricsResponse:
        pods = await self.stats.pod_metrics()
        return pb.ListPodSandboxMetricsResponse(pod_metrics=[pod_metrics(p) for p in pods])

    StreamPodSandboxMetrics = streamed_list(
        "StreamPodSandboxMetrics", ListPodSandboxMetrics, pb.ListPodSandboxMetricsRequest,
        "pod_metrics", pb.StreamPodSandboxMetricsResponse, "pod_sandbox_metrics",
    )

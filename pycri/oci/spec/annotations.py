"""The io.kubernetes.cri.* annotations a spec carries: what the object is and which pod
it belongs to, for the runtime, its hooks and NRI plugins to read."""

from __future__ import annotations

from pycri.api import api_pb2 as pb

ANNOTATION_PREFIX = "io.kubernetes.cri."
# The pod-level resources a VM-based handler sizes its sandbox by (containerd's names and
# meaning: LinuxPodSandboxConfig.resources, the sum of the containers' limits).
SANDBOX_RESOURCE_ANNOTATIONS = {
    ANNOTATION_PREFIX + "sandbox-cpu-period": "cpu_period",
    ANNOTATION_PREFIX + "sandbox-cpu-quota": "cpu_quota",
    ANNOTATION_PREFIX + "sandbox-cpu-shares": "cpu_shares",
    ANNOTATION_PREFIX + "sandbox-memory": "memory_limit_in_bytes",
}


def container_annotations(
    config: pb.ContainerConfig, sandbox: pb.PodSandboxConfig, sandbox_id: str
) -> dict[str, str]:
    """The request's annotations, then pycri's (which win)."""
    annotations = dict(config.annotations)
    annotations.update(
        {
            ANNOTATION_PREFIX + "container-type": "container",
            ANNOTATION_PREFIX + "container-name": config.metadata.name,
            ANNOTATION_PREFIX + "sandbox-id": sandbox_id,
            ANNOTATION_PREFIX + "sandbox-name": sandbox.metadata.name,
            ANNOTATION_PREFIX + "sandbox-namespace": sandbox.metadata.namespace,
            ANNOTATION_PREFIX + "sandbox-uid": sandbox.metadata.uid,
            ANNOTATION_PREFIX + "image-name": config.image.user_specified_image
            or config.image.image,
        }
    )
    return annotations


def sandbox_annotations(config: pb.PodSandboxConfig, sandbox_id: str) -> dict[str, str]:
    """The request's annotations, then pycri's, then the pod-level resources if set."""
    annotations = dict(config.annotations)
    annotations.update(
        {
            ANNOTATION_PREFIX + "container-type": "sandbox",
            ANNOTATION_PREFIX + "sandbox-id": sandbox_id,
            ANNOTATION_PREFIX + "sandbox-name": config.metadata.name,
            ANNOTATION_PREFIX + "sandbox-namespace": config.metadata.namespace,
            ANNOTATION_PREFIX + "sandbox-uid": config.metadata.uid,
            ANNOTATION_PREFIX + "sandbox-log-directory": config.log_directory,
        }
    )
    if config.linux.HasField("resources"):
        res = config.linux.resources
        for key, name in SANDBOX_RESOURCE_ANNOTATIONS.items():
            annotations[key] = str(getattr(res, name))
    return annotations

"""CRI request + image config → OCI runtime spec, as pure functions (no I/O).

build.py assembles the container's and the infra's spec from one module per concern:
process.py (argv, env, cwd, user, rlimits, oom score), image.py (the image config),
capabilities.py, security.py (AppArmor, SELinux, masked paths, seccomp),
namespaces.py (and the pod's user namespace), mounts.py, devices.py, resources.py
(linux.resources, cgroupsPath, pod limits) and annotations.py.

Re-exported here: what the container and sandbox managers, the stats collector and
criu/creds.py use.
"""

from pycri.oci.spec.build import ContainerContext, SandboxContext, container_spec, sandbox_spec
from pycri.oci.spec.capabilities import ALL_CAPABILITIES, capabilities_from_mask
from pycri.oci.spec.image import ImageConfig
from pycri.oci.spec.mounts import (
    check_image_volume,
    check_recursive_read_only,
    idmap_key,
    image_volume_key,
    is_idmapped,
    rro_key,
)
from pycri.oci.spec.namespaces import IDMap, UserNamespace, pod_id_maps
from pycri.oci.spec.resources import cgroups_path, pod_limits, resources_to_oci

__all__ = [
    "ALL_CAPABILITIES",
    "ContainerContext",
    "IDMap",
    "ImageConfig",
    "SandboxContext",
    "UserNamespace",
    "capabilities_from_mask",
    "cgroups_path",
    "check_image_volume",
    "check_recursive_read_only",
    "container_spec",
    "idmap_key",
    "image_volume_key",
    "is_idmapped",
    "pod_id_maps",
    "pod_limits",
    "resources_to_oci",
    "rro_key",
    "sandbox_spec",
]

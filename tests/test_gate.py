"""The request gate (pycri/gate.py): a table of bad requests, each refused with
the field's dotted path, and the requests critest and the kubelet send, all accepted."""

from __future__ import annotations

import random
import uuid

import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pycri.api import api_pb2 as pb
from pycri.errors import InvalidArgument
from pycri.gate import MAX_ITEMS, check_request


def pod(**kw: object) -> pb.PodSandboxConfig:
    md = kw.pop("metadata", None) or pb.PodSandboxMetadata(
        name="nginx-7c5ddbdf54-x2x9q", namespace="default", uid=str(uuid.uuid4()))
    return pb.PodSandboxConfig(metadata=md, **kw)  # type: ignore[arg-type]


def run(**kw: object) -> pb.RunPodSandboxRequest:
    return pb.RunPodSandboxRequest(config=pod(**kw))


def ctr(**kw: object) -> pb.CreateContainerRequest:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             image=pb.ImageSpec(image="127.0.0.1:5000/busybox:1"),
                             **kw)  # type: ignore[arg-type]
    return pb.CreateContainerRequest(pod_sandbox_id="ab12" * 16, config=cfg,
                                     sandbox_config=pod())


def res(**kw: int) -> pb.CreateContainerRequest:
    return ctr(linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(**kw)))


def csc(**kw: object) -> pb.CreateContainerRequest:
    return ctr(linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(**kw)))  # type: ignore[arg-type]


BAD: list[tuple[str, object, str]] = [
    # defect 6: a NUL in the pod name (and in anything else)
    ("nul in pod name", run(metadata=pb.PodSandboxMetadata(
        name="a\x00b", namespace="n", uid="u")), "config.metadata.name: contains a NUL byte"),
    ("nul in a label", run(labels={"k": "v\x00"}), "config.labels['k']: contains a NUL"),
    ("nul in an annotation", run(annotations={"k": "a\x00"}),
     "config.annotations['k']: contains a NUL"),
    ("nul in an exec arg", pb.ExecSyncRequest(container_id="ab", cmd=["sh", "a\x00"]),
     "cmd[1]: contains a NUL"),
    ("nul in an image ref", pb.PullImageRequest(image=pb.ImageSpec(image="busybox\x00")),
     "image.image: contains a NUL"),
    ("escape in pod name", run(metadata=pb.PodSandboxMetadata(
        name="a\x1bb", namespace="n", uid="u")), "control character 0x1b"),
    ("newline in namespace", run(metadata=pb.PodSandboxMetadata(
        name="a", namespace="n\n", uid="u")), "config.metadata.namespace: contains control"),
    ("newline in a label key", run(labels={"k\n": "v"}), "(key): contains control"),
    # names
    ("empty pod name", run(metadata=pb.PodSandboxMetadata(namespace="n", uid="u")),
     "config.metadata.name: must be set"),
    ("empty pod uid", run(metadata=pb.PodSandboxMetadata(name="a", namespace="n")),
     "config.metadata.uid: must be set"),
    ("slash in pod name", run(metadata=pb.PodSandboxMetadata(
        name="a/b", namespace="n", uid="u")), "config.metadata.name: may not contain '/'"),
    ("'=' in pod uid", run(metadata=pb.PodSandboxMetadata(
        name="a", namespace="n", uid="u=1")), "config.metadata.uid: may not contain '='"),
    ("dot-dot pod name", run(metadata=pb.PodSandboxMetadata(
        name="..", namespace="n", uid="u")), "is not a name"),
    ("long pod name", run(metadata=pb.PodSandboxMetadata(
        name="a" * 254, namespace="n", uid="u")), "longer than 253"),
    ("empty container name", pb.CreateContainerRequest(
        pod_sandbox_id="ab", config=pb.ContainerConfig()), "config.metadata.name: must be set"),
    ("create without a pod id", pb.CreateContainerRequest(config=pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"))), "pod_sandbox_id: must be set"),
    ("slash in container name", pb.CreateContainerRequest(pod_sandbox_id="ab", config=(
        pb.ContainerConfig(metadata=pb.ContainerMetadata(name="../x")))), "may not contain"),
    # hostname (defect 15)
    ("hostname of 65", run(hostname="h" * 65), "config.hostname: longer than 64"),
    ("FQDN of 65", run(hostname="a" * 40 + ".sub.ns.svc.cluster.local"),
     "config.hostname: longer than 64"),
    ("hostname '.'", run(hostname="."), "config.hostname: must be"),
    ("hostname ending in '..'", run(hostname="a.."), "config.hostname: must be"),
    ("hostname starting with '.'", run(hostname=".a"), "config.hostname: must be"),
    ("hostname with a newline", run(hostname="a\nb"), "config.hostname: contains control"),
    ("hostname with a space", run(hostname="a b"), "config.hostname: must be dot-separated"),
    ("hostname with empty label", run(hostname="a..b"), "config.hostname: must be"),
    ("hostname ending in '-'", run(hostname="a-"), "config.hostname: must be"),
    # log paths (defect 11)
    ("relative log directory", run(log_directory="var/log"), "config.log_directory: must be"),
    ("log directory with ..", run(log_directory="/var/log/../etc"),
     "config.log_directory: must be an absolute, normalised"),
    ("absolute log path", ctr(log_path="/etc/passwd"),
     "config.log_path: must be relative to the pod's log_directory"),
    ("log path with ..", ctr(log_path="../../etc/x.log"), "config.log_path: must stay inside"),
    ("log path escaping midway", ctr(log_path="a/../../x.log"), "config.log_path: must stay"),
    ("log path of .", ctr(log_path="."), "config.log_path: must stay inside"),
    # mounts, devices, sysctls
    ("relative container path", ctr(mounts=[pb.Mount(container_path="mnt", host_path="/x")]),
     "config.mounts[0].container_path: must be an absolute path"),
    ("relative host path", ctr(mounts=[pb.Mount(container_path="/m", host_path="x")]),
     "config.mounts[0].host_path: must be an absolute path"),
    ("host path with ..", ctr(mounts=[pb.Mount(container_path="/m", host_path="/a/../etc")]),
     "config.mounts[0].host_path: may not contain '..'"),
    ("filesystem option on a bind", ctr(mounts=[pb.Mount(
        container_path="/m", host_path="/x", mount_options=["noexec", "size=1m"])]),
     "config.mounts[0].mount_options[1]: 'size=1m' is not a bind-mount option"),
    ("propagation as a mount option", ctr(mounts=[pb.Mount(
        container_path="/m", host_path="/x", mount_options=["rshared"])]),
     "config.mounts[0].mount_options[0]: 'rshared' is not a bind-mount option"),
    ("relative device path", ctr(devices=[pb.Device(container_path="/dev/x",
                                                    host_path="dev/null")]),
     "config.devices[0].host_path: must be an absolute path"),
    ("relative working dir", ctr(working_dir="app"),
     "config.working_dir: must be an absolute path"),
    ("sysctl with ..", run(linux=pb.LinuxPodSandboxConfig(sysctls={"net/../x": "1"})),
     "config.linux.sysctls['net/../x'] (key): is not a sysctl name"),
    ("sysctl with space", run(linux=pb.LinuxPodSandboxConfig(sysctls={"net ipv4": "1"})),
     "is not a sysctl name"),
    # ids
    ("id with a slash", pb.StartContainerRequest(container_id="../../x"),
     "container_id: must be letters"),
    ("filter id with a space", pb.ListContainersRequest(filter=pb.ContainerFilter(id="a b")),
     "filter.id: must be letters"),
    ("long id", pb.RemovePodSandboxRequest(pod_sandbox_id="a" * 129), "longer than 128"),
    ("target id with a slash", csc(namespace_options=pb.NamespaceOption(
        pid=pb.TARGET, target_id="/x")), "namespace_options.target_id: must be letters"),
    ("exec without a command", pb.ExecSyncRequest(container_id="ab"), "cmd: must be set"),
    ("exec without an id", pb.ExecRequest(cmd=["sh"]), "container_id: must be set"),
    ("port forward without a pod", pb.PortForwardRequest(port=[80]),
     "pod_sandbox_id: must be set"),
    ("pull without a ref", pb.PullImageRequest(), "image.image: must be set"),
    ("long image ref", pb.PullImageRequest(image=pb.ImageSpec(image="a" * 1025)),
     "image.image: longer than 1024"),
    # integer ranges
    ("oom_score_adj", res(oom_score_adj=1001), "resources.oom_score_adj: 1001 is outside"),
    ("negative oom_score_adj", res(oom_score_adj=-1001), "-1001 is outside -1000..1000"),
    ("cpu shares", res(cpu_shares=262145), "resources.cpu_shares: 262145 is outside"),
    ("cpu period", res(cpu_period=10), "resources.cpu_period: 10 is outside"),
    ("cpu quota", res(cpu_quota=999), "resources.cpu_quota: 999 is outside"),
    # the kernel's EINVAL above 2^44-1 µs was an UNKNOWN "creating the pod cgroup"
    ("cpu quota over the kernel's", res(cpu_quota=2**63 - 1),
     "resources.cpu_quota: 9223372036854775807 is outside 1000..17592186044415"),
    ("negative memory", res(memory_limit_in_bytes=-5), "memory_limit_in_bytes: -5"),
    ("port", run(port_mappings=[pb.PortMapping(container_port=70000)]),
     "config.port_mappings[0].container_port: 70000 is outside 0..65535"),
    ("host port without a container port", run(port_mappings=[pb.PortMapping(host_port=80)]),
     "config.port_mappings[0].container_port: must be set when host_port is"),
    ("bad host IP", run(port_mappings=[pb.PortMapping(container_port=80, host_port=80,
                                                      host_ip="10.0.0.300")]),
     "config.port_mappings[0].host_ip: is not an IP address"),
    ("negative host port", run(port_mappings=[pb.PortMapping(host_port=-1)]),
     "host_port: -1 is outside"),
    ("port forward port 0", pb.PortForwardRequest(pod_sandbox_id="ab", port=[0]),
     "port[0]: 0 is outside 1..65535"),
    ("negative stop timeout", pb.StopContainerRequest(container_id="ab", timeout=-1),
     "timeout: -1 is outside"),
    ("negative exec timeout", pb.ExecSyncRequest(container_id="ab", cmd=["x"], timeout=-3),
     "timeout: -3 is outside"),
    ("negative uid", csc(run_as_user=pb.Int64Value(value=-1)),
     "security_context.run_as_user: -1 is outside 0..4294967294"),
    ("uid beyond 32 bits", csc(run_as_group=pb.Int64Value(value=2**32)), "run_as_group"),
    ("negative supplemental group", csc(supplemental_groups=[1, -2]),
     "security_context.supplemental_groups[1]: -2 is outside"),
    # enums and sizes
    ("unknown protocol", run(port_mappings=[pb.PortMapping(protocol=7)]),  # type: ignore[arg-type]
     "config.port_mappings[0].protocol: 7 is not a known Protocol"),
    ("unknown namespace mode", csc(namespace_options=pb.NamespaceOption(pid=9)),  # type: ignore[arg-type]
     "namespace_options.pid: 9 is not a known NamespaceMode"),
    ("too many args", ctr(args=["a"] * (MAX_ITEMS + 1)),
     f"config.args: more than {MAX_ITEMS} entries"),
    ("pod unified key cgroup.procs", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(unified={"cgroup.procs": "1"}))),
     "config.linux.resources.unified['cgroup.procs'] (key): is not a cgroup v2"),
    ("overhead unified key with a path", run(linux=pb.LinuxPodSandboxConfig(
        overhead=pb.LinuxContainerResources(unified={"memory.../x": "1"}))),
     "config.linux.overhead.unified['memory.../x'] (key): is not a cgroup v2"),
    ("container unified key outside the controllers", ctr(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(unified={"cgroup.subtree_control": "+cpu"}))),
     "is not a cgroup v2 controller file"),
    ("NUL in an argument", ctr(args=["a\x00b"]), "config.args[0]: contains a NUL byte"),
    ("mount path climbing to the root", ctr(mounts=[pb.Mount(
        container_path="/data/..", host_path="/tmp")]), "must name a path inside the container"),
    ("relative working dir", ctr(working_dir="srv"), "config.working_dir: must be an absolute"),
    ("too many labels", run(labels={str(i): "v" for i in range(MAX_ITEMS + 1)}),
     "config.labels: more than"),
    ("annotations too large", run(annotations={f"k{i}": "v" * 200_000 for i in range(3)}),
     "config.annotations: 600006 bytes in total, more than 524288"),
    ("label value too long", run(labels={"k": "v" * 20000}), "longer than 16384"),
    ("label key too long", run(labels={"k" * 20000: "v"}),
     "config.labels['" + "k" * 64 + "…'] (key): longer than 16384"),
    # values the kernel or runc would refuse half-way through a create or update
    ("cpuset garbage", res(cpuset_cpus="0-1,x"), "resources.cpuset_cpus: is not a CPU"),
    ("cpuset mems garbage", res(cpuset_mems="ð["), "resources.cpuset_mems: is not a CPU"),
    ("hugepage size garbage", ctr(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(hugepage_limits=[pb.HugepageLimit(
            page_size="{W", limit=1)]))), "hugepage_limits[0].page_size: is not a huge page"),
    ("memory below the floor", res(memory_limit_in_bytes=256),
     "resources.memory_limit_in_bytes: 256 is outside 4096"),
    ("swap without memory", res(memory_swap_limit_in_bytes=20 << 20),
     "memory_swap_limit_in_bytes: needs memory_limit_in_bytes"),
    ("swap below memory", res(memory_limit_in_bytes=256 << 20,
                              memory_swap_limit_in_bytes=145551800),
     "memory_swap_limit_in_bytes: counts memory too"),
    ("update memory below the floor", pb.UpdateContainerResourcesRequest(
        container_id="ab", linux=pb.LinuxContainerResources(memory_limit_in_bytes=1)),
     "linux.memory_limit_in_bytes: 1 is outside"),
    ("sysctl of no namespace", run(linux=pb.LinuxPodSandboxConfig(sysctls={"5da7aa": "1"})),
     "config.linux.sysctls['5da7aa']: is not a namespaced sysctl"),
    ("host-wide sysctl", run(linux=pb.LinuxPodSandboxConfig(sysctls={"vm.swappiness": "1"})),
     "is not a namespaced sysctl"),
    ("net sysctl on the host network", run(linux=pb.LinuxPodSandboxConfig(
        sysctls={"net.ipv4.ip_forward": "1"}, security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE)))),
     "would change the host's"),
    ("ipc sysctl with the host IPC", run(linux=pb.LinuxPodSandboxConfig(
        sysctls={"kernel.shm_rmid_forced": "1"}, security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(ipc=pb.NODE)))),
     "would change the host's"),
    ("exec of an empty program", pb.ExecSyncRequest(container_id="ab", cmd=["", ""]),
     "cmd[0]: must name the program to run"),
    # found by the 100,000-request fuzz run
    ("device without a host path (the daemon's cwd was walked for nodes)",
     ctr(devices=[pb.Device(container_path="//")]), "config.devices[0].host_path: must name"),
    ("device at the root", ctr(devices=[pb.Device(container_path="//", host_path="/dev/null")]),
     "config.devices[0].a device path may not be '/'"),
    ("mount over the root", ctr(mounts=[pb.Mount(container_path="/", host_path="/tmp")]),
     "config.mounts[0].container_path: must name a path inside the container"),
    ("bind inside the container's procfs (found by fuzzing: runc's opaque refusal)",
     ctr(mounts=[pb.Mount(container_path="/proc/self/root", host_path="/tmp")]),
     "config.mounts[0].container_path: /proc is the container's own procfs"),
    ("bind over /proc", ctr(mounts=[pb.Mount(container_path="/proc", host_path="/tmp")]),
     "config.mounts[0].container_path: /proc is the container's own procfs"),
    ("mount without a destination", ctr(mounts=[pb.Mount(host_path="/tmp")]),
     "config.mounts[0].container_path: must name"),
    ("log path component over NAME_MAX", ctr(log_path="9" * 256),
     "config.log_path: has a path component longer than 255 bytes"),
    ("log directory component over NAME_MAX", run(log_directory="/logs/" + "d" * 256),
     "config.log_directory: has a path component longer than 255"),
    ("cgroup parent component over NAME_MAX",
     run(linux=pb.LinuxPodSandboxConfig(cgroup_parent="-" * 4000)),
     "config.linux.cgroup_parent: has a path component longer than 255"),
    ("relative read-only path", csc(readonly_paths=["9" * 10]),
     "security_context.readonly_paths[0]: must be an absolute path"),
    # pod overhead and pod-level resources (issue 15)
    ("pod memory below the floor", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(memory_limit_in_bytes=1024))),
     "config.linux.resources.memory_limit_in_bytes: 1024 is outside"),
    ("negative overhead memory", run(linux=pb.LinuxPodSandboxConfig(
        overhead=pb.LinuxContainerResources(memory_limit_in_bytes=-5))),
     "config.linux.overhead.memory_limit_in_bytes: -5 is outside"),
    ("overhead quota below 1 ms", run(linux=pb.LinuxPodSandboxConfig(
        overhead=pb.LinuxContainerResources(cpu_quota=10, cpu_period=100000))),
     "config.linux.overhead.cpu_quota: 10 is outside"),
    ("pod cpu period over 1 s", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(cpu_period=2_000_000))),
     "config.linux.resources.cpu_period: 2000000 is outside"),
    ("pod shares over the kernel's", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(cpu_shares=300_000))),
     "config.linux.resources.cpu_shares: 300000 is outside"),
    ("pod-level cpuset", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(cpuset_cpus="0"))),
     "config.linux.resources.cpuset_cpus: a pod-level limit can only be one of"),
    ("overhead huge pages", run(linux=pb.LinuxPodSandboxConfig(
        overhead=pb.LinuxContainerResources(hugepage_limits=[pb.HugepageLimit(
            page_size="2MB", limit=1)]))),
     "config.linux.overhead.hugepage_limits: a pod-level limit can only be one of"),
    ("CDI device without a kind", ctr(CDI_devices=[pb.CDIDevice(name="gpu0")]),
     "config.CDI_devices[0].name: CDI device 'gpu0' is not vendor.com/class=name"),
    ("CDI device with a bad vendor", ctr(CDI_devices=[pb.CDIDevice(name="-v.com/gpu=0")]),
     "invalid vendor '-v.com'"),
    ("CDI device with a bad name", ctr(CDI_devices=[pb.CDIDevice(name="v.com/gpu=a/b")]),
     "device name 'a/b' must start and end"),
    ("CDI annotation with a bad device",
     ctr(annotations={"cdi.k8s.io/plugin_dev": "v.com/gpu=0,gpu1"}),
     "config.annotations['cdi.k8s.io/plugin_dev']: CDI device 'gpu1' is not"),
    ("CDI annotation empty", ctr(annotations={"cdi.k8s.io/x": ""}),
     "CDI device '' is not vendor.com/class=name"),
    # pod resize (issue 11): what RunPodSandbox takes, and a pod to resize
    ("resize of no pod", pb.UpdatePodSandboxResourcesRequest(
        resources=pb.LinuxContainerResources(cpu_shares=2)), "pod_sandbox_id: must be set"),
    ("resize below the memory floor", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id="ab", resources=pb.LinuxContainerResources(memory_limit_in_bytes=1024)),
     "resources.memory_limit_in_bytes: 1024 is outside"),
    ("resize with negative overhead", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id="ab", overhead=pb.LinuxContainerResources(memory_limit_in_bytes=-1)),
     "overhead.memory_limit_in_bytes: -1 is outside"),
    ("resize of a pod's cpuset", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id="ab", resources=pb.LinuxContainerResources(cpuset_mems="0")),
     "resources.cpuset_mems: a pod-level limit can only be one of"),
]


@pytest.mark.parametrize(("request_", "message"), [(r, m) for _, r, m in BAD],
                         ids=[n for n, _, _ in BAD])
def test_bad_request_is_refused_naming_the_field(request_: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_request(request_)  # type: ignore[arg-type]
    assert message in str(e.value)


def critest_pod(name: str = "PodSandbox-with-log-directory-") -> pb.PodSandboxConfig:
    """As cri-tools' pkg/validate builds them: long mixed-case names with a UUID."""
    u = str(uuid.uuid4())
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name + u, uid="cri-test-uid" + u,
                                       namespace="cri-test-namespace" + u, attempt=0),
        log_directory=f"/tmp/podLogTest123/{name}{u}",
        labels={"io.kubernetes.pod.name": name + u},
        linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/pod" + u),
    )


GOOD: list[tuple[str, object]] = [
    ("critest pod", pb.RunPodSandboxRequest(config=critest_pod())),
    ("critest hostname", run(hostname="test-hostname")),
    ("crictl hostname with _", run(hostname="crictl_host")),
    ("node FQDN hostname", run(hostname="ip-10-0-0-1.eu-west-1.compute.internal")),
    ("hostname of 63", run(hostname="h" * 63)),
    # What else a kubelet sends that the first rules refused (issue 25; docs/cri-fields.md
    # "What the gate refuses"): a kubelet >= 1.32 on cgroup v2 asks for memory.oom.group on
    # the pod; service links make 7 env vars per Service of the namespace; command, args
    # and annotation values are any string the API took.
    ("kubelet pod on cgroup v2", run(linux=pb.LinuxPodSandboxConfig(
        resources=pb.LinuxContainerResources(unified={"memory.oom.group": "1"}),
        overhead=pb.LinuxContainerResources(unified={"memory.oom.group": "1"})))),
    ("kubelet container on cgroup v2 with MemoryQoS", ctr(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(
            unified={"memory.oom.group": "1", "memory.min": "0", "memory.high": "max"})))),
    ("service links of 1,500 Services", ctr(envs=[
        pb.KeyValue(key=f"SVC_{i}_SERVICE_PORT_HTTP_TCP_ADDR", value=b"10.96.0.1")
        for i in range(10_500)])),
    ("control characters in args", ctr(command=["printf"], args=["\x1b[1mhi\x07\x0c"])),
    ("mount path with '..' as the pod spec has it", ctr(mounts=[pb.Mount(
        container_path="/data/../cache", host_path="/tmp")])),
    ("working dir with '.' and '..'", ctr(working_dir="/srv/./app/..")),
    ("control character in an annotation value", run(annotations={"note": "a\x01b\x7f"})),
    # The kubelet's forms (issue 25): pod names are DNS subdomains (dots allowed), and
    # setHostnameAsFQDN gives <name>.<subdomain>.<ns>.svc.<cluster domain> of at most 64,
    # ending in '.' when the cluster domain is empty.
    ("pod name with dots as hostname", run(hostname="web.v1-2.x")),
    ("hostname of 64", run(hostname="h" * 64)),
    ("FQDN hostname", run(hostname="web-0.sub.e2e.svc.cluster.local")),
    ("FQDN hostname, empty cluster domain", run(hostname="web-0.sub.e2e.svc.")),
    ("FQDN of 64", run(hostname="a" * 39 + ".sub.ns.svc.cluster.local")),
    ("FQDN of 64, empty cluster domain", run(hostname="0" * 52 + ".sub.ns.svc.")),
    ("kubelet container", pb.CreateContainerRequest(
        pod_sandbox_id="ab12" * 16,
        config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="nginx", attempt=3),
            image=pb.ImageSpec(image="sha256:" + "a" * 64,
                               user_specified_image="docker.io/library/nginx:1.25"),
            command=["/bin/sh", "-c", "echo a\n\techo b\r\n"],
            args=["--flag=x"],
            working_dir="/app/",
            envs=[pb.KeyValue(key="MULTI", value=b"line1\nline2")],
            mounts=[pb.Mount(container_path="/var/run/secrets/kubernetes.io/serviceaccount",
                             host_path="/var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/"
                                       "kube-api-access-x", readonly=True),
                    pb.Mount(container_path="/data", host_path="/data/",
                             mount_options=["noexec", "nosuid", "nodev"])],
            devices=[pb.Device(container_path="/dev/fuse", host_path="/dev/fuse",
                               permissions="rwm")],
            labels={"io.kubernetes.container.name": "nginx"},
            annotations={"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                         "kubectl.kubernetes.io/last-applied-configuration": '{\n "a": 1\n}\n'},
            log_path="nginx/3.log",
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                cpu_period=100000, cpu_quota=-1, cpu_shares=2, oom_score_adj=-997,
                memory_limit_in_bytes=0, memory_swap_limit_in_bytes=-1)),
        ),
        sandbox_config=critest_pod())),
    ("critest log path", ctr(log_path="container-with-log-" + str(uuid.uuid4()) + ".log")),
    ("sysctls", run(linux=pb.LinuxPodSandboxConfig(sysctls={
        "kernel.shm_rmid_forced": "1", "net.ipv4.ip_local_port_range": "1024 65000",
        "net/ipv4/conf/eth0.100/forwarding": "1"}))),
    ("empty list filters", pb.ListContainersRequest(filter=pb.ContainerFilter())),
    ("list by id prefix", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id="ab12"))),
    ("stop with the default timeout", pb.StopContainerRequest(container_id="ab", timeout=0)),
    ("remove of an unknown id", pb.RemoveContainerRequest(container_id="0" * 64)),
    ("version", pb.VersionRequest(version="0.1.0")),
    ("lxcfs-style bind over a procfs file", ctr(mounts=[
        pb.Mount(container_path="/proc/meminfo", host_path="/var/lib/lxcfs/proc/meminfo")])),
    ("a directory named like procfs elsewhere", ctr(mounts=[
        pb.Mount(container_path="/procedures", host_path="/tmp")])),
    ("port forward", pb.PortForwardRequest(pod_sandbox_id="ab", port=[8080])),
    ("pull with credentials", pb.PullImageRequest(
        image=pb.ImageSpec(image="127.0.0.1:5000/a/b:c@sha256:" + "0" * 64),
        auth=pb.AuthConfig(username="u", password="p\tw\n"))),
    ("annotations at 256 KiB", run(annotations={"big": "x" * 256 * 1024})),
    ("host IPs", run(port_mappings=[
        pb.PortMapping(container_port=80, host_port=8080, host_ip="127.0.0.1"),
        pb.PortMapping(container_port=80, host_port=8080, host_ip="::1")])),
    ("host port 0", run(port_mappings=[pb.PortMapping(container_port=80, protocol=pb.UDP)])),
    ("critest OOM limits", res(memory_limit_in_bytes=15 << 20,
                               memory_swap_limit_in_bytes=15 << 20)),
    ("cpusets and huge pages", ctr(linux=pb.LinuxContainerConfig(
        resources=pb.LinuxContainerResources(cpuset_cpus="0-1,3", cpuset_mems="0",
                                             hugepage_limits=[pb.HugepageLimit(
                                                 page_size="2MB", limit=0)])))),
    ("kubelet pod overhead and resources", run(linux=pb.LinuxPodSandboxConfig(
        cgroup_parent="/kubepods/burstable/pod1",
        overhead=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=1000, cpu_shares=10,
                                            memory_limit_in_bytes=5 << 20),
        resources=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=-1, cpu_shares=2,
                                             memory_limit_in_bytes=64 << 20)))),
    ("CDI devices, by field and by annotation", ctr(
        CDI_devices=[pb.CDIDevice(name="nvidia.com/gpu=0"), pb.CDIDevice(name="v.io/c.x=a:b")],
        annotations={"cdi.k8s.io/vendor.gpu_0": "nvidia.com/gpu=1,nvidia.com/gpu=all",
                     "other.io/cdi": "not a device"})),
    ("kubelet pod resize", pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id="ab12",
        overhead=pb.LinuxContainerResources(cpu_quota=1000, memory_limit_in_bytes=5 << 20),
        resources=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=200000,
                                             cpu_shares=204, memory_limit_in_bytes=128 << 20))),
    ("critest unsafe sysctl", run(linux=pb.LinuxPodSandboxConfig(
        sysctls={"fs.mqueue.msg_max": "100", "kernel.msg_max": "8192", "kernel.sem": "1 2 3 4"}))),
]


@pytest.mark.parametrize("request_", [r for _, r in GOOD], ids=[n for n, _ in GOOD])
def test_legitimate_request_is_accepted(request_: object) -> None:
    check_request(request_)  # type: ignore[arg-type]


def _random_message(msg: Message, rng: random.Random, depth: int = 0) -> None:
    """Fill `msg` with hostile values: control characters, extreme integers, unknown
    enums, deep nesting."""
    strings = ["", "a", "\x00", "a\nb", "../..", "/", "x" * 70_000, "é\x7f", "a;b=c", "0" * 64]
    ints = [0, 1, -1, 2**31 - 1, -(2**31), 65536, 1000, 10**6 + 1]
    for field in msg.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        count = rng.choice([1, 2, 3]) if field.is_repeated else 1
        for _ in range(count):
            if is_map:
                entries, key = getattr(msg, field.name), rng.choice(strings)
                if field.message_type.fields_by_name["value"].message_type is not None:
                    _random_message(entries[key], rng, depth + 1)
                else:
                    entries[key] = rng.choice(strings)
            elif field.message_type is not None:
                if depth > 4:
                    break
                sub = getattr(msg, field.name).add() if field.is_repeated else getattr(
                    msg, field.name)
                _random_message(sub, rng, depth + 1)
                if not field.is_repeated:
                    sub.SetInParent()
            else:
                value = _scalar(field, rng, strings, ints)
                if field.is_repeated:
                    getattr(msg, field.name).append(value)
                else:
                    setattr(msg, field.name, value)


def _scalar(field: FieldDescriptor, rng: random.Random, strings: list[str],
            ints: list[int]) -> object:
    if field.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(strings)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return rng.choice(strings).encode()
    if field.type == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if field.type == FieldDescriptor.TYPE_ENUM:
        return rng.choice([0, 1, 2, 99])
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice([0.0, -1.5, 1e30])
    unsigned = field.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
                              FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64)
    return abs(rng.choice(ints)) if unsigned else rng.choice(ints)


def test_every_request_type_is_accepted_or_refused_with_invalid_argument() -> None:
    """The gate itself never fails: each hostile request passes or is InvalidArgument."""
    rng = random.Random(8)
    kinds = {m.input_type for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert len(kinds) > 30
    refused = accepted = 0
    for desc in sorted(kinds, key=lambda d: d.name):
        cls = message_factory.GetMessageClass(desc)
        for _ in range(60):
            msg = cls()
            _random_message(msg, rng)
            try:
                check_request(msg)
                accepted += 1
            except InvalidArgument as e:
                assert ": " in str(e)  # names the field
                refused += 1
    assert refused > 0 and accepted > 0


# -- user namespaces (NamespaceOption.userns_options) ------------------------------------


def _userns(mode: int = pb.POD, uids: list[pb.IDMapping] | None = None,
            gids: list[pb.IDMapping] | None = None, **ns: int) -> pb.NamespaceOption:
    m = [pb.IDMapping(host_id=65536, length=65536)]
    return pb.NamespaceOption(userns_options=pb.UserNamespace(
        mode=mode, uids=m if uids is None else uids, gids=m if gids is None else gids), **ns)


def _userns_pod(ns: pb.NamespaceOption, privileged: bool = False) -> pb.RunPodSandboxRequest:
    return run(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        namespace_options=ns, privileged=privileged)))


USERNS = "config.linux.security_context.namespace_options.userns_options."
USERNS_BAD = [
    ("container mode", _userns_pod(_userns(pb.CONTAINER, [], [])), USERNS + "mode: a user "
     "namespace per container (CONTAINER, TARGET) is not supported"),
    ("target mode", _userns_pod(_userns(pb.TARGET, [], [])), USERNS + "mode: a user namespace"),
    ("POD without mappings", _userns_pod(_userns(uids=[], gids=[])),
     USERNS + "mode POD needs exactly one uid and one gid mapping (got 0 and 0)"),
    ("two mappings", _userns_pod(_userns(uids=[pb.IDMapping(host_id=1000, length=10)] * 2)),
     "exactly one uid and one gid mapping (got 2 and 1)"),
    ("container ID 0 not mapped", _userns_pod(_userns(
        uids=[pb.IDMapping(container_id=1, host_id=1000, length=10)])),
     USERNS + "mode POD needs container ID 0 mapped"),
    ("different shapes", _userns_pod(_userns(gids=[pb.IDMapping(host_id=65536, length=1000)])),
     USERNS + "uid and gid mappings must have the same shape (lengths 65536 and 1000)"),
    ("host root mapped", _userns_pod(_userns(uids=[pb.IDMapping(host_id=0, length=65536)],
                                             gids=[pb.IDMapping(host_id=0, length=65536)])),
     USERNS + "uids[0].host_id: 0 would map the host's root into the pod"),
    ("empty mapping", _userns_pod(_userns(uids=[pb.IDMapping(host_id=9, length=0)],
                                          gids=[pb.IDMapping(host_id=9, length=0)])),
     USERNS + "uids[0].length: must be at least 1"),
    ("mapping past 2^32", _userns_pod(_userns(
        uids=[pb.IDMapping(host_id=2**32 - 10, length=65536)],
        gids=[pb.IDMapping(host_id=2**32 - 10, length=65536)])), "maps IDs past 4294967294"),
    ("NODE with mappings", _userns_pod(_userns(pb.NODE)), USERNS + "uids: mappings need mode POD"),
    ("privileged", _userns_pod(_userns(), privileged=True),
     "config.linux.security_context.privileged: not allowed with a user namespace"),
    ("host network", _userns_pod(_userns(network=pb.NODE)),
     "namespace_options.network: a pod with its own user namespace cannot use the host's"),
    ("host PID", _userns_pod(_userns(pid=pb.NODE)), "namespace_options.pid: a pod with its own"),
    ("host IPC", _userns_pod(_userns(ipc=pb.NODE)), "namespace_options.ipc: a pod with its own"),
    ("privileged container", ctr(linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(privileged=True,
                                                          namespace_options=_userns()))),
     "config.linux.security_context.privileged: not allowed with a user namespace"),
    ("mount with uid mappings only", ctr(mounts=[pb.Mount(
        container_path="/m", host_path="/h", uidMappings=[pb.IDMapping(host_id=1, length=1)])]),
     "config.mounts[0].uidMappings: an idmapped mount needs both"),
    ("mount mapping host root", ctr(mounts=[pb.Mount(
        container_path="/m", host_path="/h", uidMappings=[pb.IDMapping(host_id=0, length=9)],
        gidMappings=[pb.IDMapping(host_id=0, length=9)])]),
     "config.mounts[0].uidMappings[0].host_id: 0 would map the host's root"),
]


@pytest.mark.parametrize(("request_", "message"), [(r, m) for _, r, m in USERNS_BAD],
                         ids=[n for n, _, _ in USERNS_BAD])
def test_user_namespace_refusals_name_the_problem(request_: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_request(request_)  # type: ignore[arg-type]
    assert message in str(e.value)


@pytest.mark.parametrize("request_", [
    _userns_pod(_userns()),  # as the kubelet sends hostUsers: false
    _userns_pod(_userns(uids=[pb.IDMapping(host_id=1000, length=100000)],  # critest's
                        gids=[pb.IDMapping(host_id=1000, length=100000)])),
    _userns_pod(_userns(pb.NODE, [], [])),
    _userns_pod(pb.NamespaceOption()),
    ctr(mounts=[pb.Mount(container_path="/m", host_path="/h",
                         uidMappings=[pb.IDMapping(host_id=65536, length=65536)],
                         gidMappings=[pb.IDMapping(host_id=65536, length=65536)])]),
], ids=["kubelet", "critest", "node", "unset", "idmapped mount"])
def test_user_namespace_requests_accepted(request_: object) -> None:
    check_request(request_)  # type: ignore[arg-type]

"""Files a pod's containers share: /etc/hostname, /etc/hosts, /etc/resolv.conf, /dev/shm.

Written once per pod into the sandbox's directory and bind-mounted into each
container, so every container of a pod sees the same name and resolver.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
from pathlib import Path

from pycri.api import api_pb2 as pb

HOST_RESOLV = Path("/etc/resolv.conf")
HOST_HOSTS = Path("/etc/hosts")
SHM_SIZE = 64 * 1024 * 1024
MNT_DETACH = 2

DEFAULT_HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def resolv_conf(dns: pb.DNSConfig, host_text: str) -> str:
    """The pod's resolv.conf: from the CRI DNSConfig, else the host's own."""
    if not (dns.servers or dns.searches or dns.options):
        return host_text
    lines = [f"nameserver {s}" for s in dns.servers]
    if dns.searches:
        lines.append("search " + " ".join(dns.searches))
    if dns.options:
        lines.append("options " + " ".join(dns.options))
    return "\n".join(lines) + "\n"


def hosts_file(host_network: bool, host_text: str) -> str:
    """Host-network pods see the host's /etc/hosts; others a loopback-only one."""
    return host_text if host_network else DEFAULT_HOSTS


def hosts_entry(ips: list[str], hostname: str) -> str:
    """The /etc/hosts line that names the pod: its first IP, the hostname as given (an FQDN
    from `setHostnameAsFQDN`, perhaps ending in '.') and its first label, so `hostname -f`
    resolves without DNS, as in a kubelet-managed hosts file."""
    if not ips:
        return ""
    names = [hostname]
    short = hostname.split(".", 1)[0]
    if short != hostname:
        names.append(short)
    return f"{ips[0]}\t{' '.join(names)}\n"


def add_hosts_entry(directory: Path, ips: list[str], hostname: str) -> None:
    """Append the pod's own line to the hosts file written before the network existed;
    appending keeps the file's owner and mode."""
    line = hosts_entry(ips, hostname)
    if line:
        with open(directory / "hosts", "a") as f:
            f.write(line)


def pod_hostname(config: pb.PodSandboxConfig, host_network: bool) -> str:
    if host_network:
        return socket.gethostname()
    return config.hostname or config.metadata.name


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def write_pod_files(
    directory: Path, config: pb.PodSandboxConfig, host_network: bool,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write hostname, hosts and resolv.conf into `directory` (created if needed); with
    `owner` (the host IDs of a user namespace's root) they are that root's to rewrite,
    as a container's root can rewrite them in a pod without one."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "hostname": pod_hostname(config, host_network) + "\n",
        "hosts": hosts_file(host_network, _read(HOST_HOSTS)),
        "resolv.conf": resolv_conf(config.dns_config, _read(HOST_RESOLV)),
    }
    for name, text in files.items():
        (directory / name).write_text(text)
        os.chmod(directory / name, 0o644)
        if owner is not None:
            os.chown(directory / name, *owner)


def mount_shm(path: Path, size: int = SHM_SIZE, owner: tuple[int, int] | None = None) -> None:
    """A private tmpfs for the pod's /dev/shm (shared by its containers, not the host),
    owned by `owner` (a user namespace's root) when given."""
    path.mkdir(parents=True, exist_ok=True)
    ids = f",uid={owner[0]},gid={owner[1]}" if owner else ""
    opts = f"mode=1777,size={size}{ids}".encode()
    flags = 0x2 | 0x4 | 0x8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _libc.mount(b"shm", str(path).encode(), b"tmpfs", flags, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    """Lazy-unmount `path` if something is mounted there; absent or unmounted is fine."""
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount {path}: {os.strerror(err)}")

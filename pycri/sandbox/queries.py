"""ListPodSandbox (and the stats lists' filter) and PodSandboxStatus's verbose info:
answered from memory."""

from __future__ import annotations

import builtins
import json

from google.protobuf import json_format

from pycri.api import api_pb2 as pb
from pycri.names import filtered
from pycri.sandbox.base import SandboxBase
from pycri.store.sandbox import Sandbox


class Queries(SandboxBase):
    def list(
        self, flt: pb.PodSandboxFilter | pb.PodSandboxStatsFilter | None
    ) -> builtins.list[Sandbox]:
        """Sandboxes matching a ListPodSandbox or ListPodSandboxStats filter."""
        out = list(self.sandboxes.values())
        if self._running:
            out = [s for s in out if s.id not in self._running]
        if flt is None:
            return out
        return filtered(out, flt)

    def verbose_info(self, sb: Sandbox) -> dict[str, str]:
        info = {
            "pid": sb.infra_pid,
            "conmonPid": sb.conmon_pid,
            "netnsPath": sb.netns,
            "runtimeHandler": sb.handler,
            "ips": sb.ips,
            "cgroupParent": sb.cgroup_parent,
            # As RunPodSandbox or the last UpdatePodSandboxResources set them.
            "podResources": {name: json_format.MessageToDict(getattr(sb.config.linux, name))
                             for name in ("overhead", "resources")
                             if sb.config.linux.HasField(name)},
            "runtimeSpec": self.launcher.spec(sb.id),
        }
        return {"info": json.dumps(info)}

"""What the kubelet's built-in cAdvisor needs to know pycri's containers (issue 44).

A kubelet with its default feature gates takes `/metrics/cadvisor` and most of
`/stats/summary` from cAdvisor, and cAdvisor names a cgroup's container, pod, namespace
and image only through a runtime plugin. Its containerd plugin asks three questions of
a containerd socket: the version, a container by ID (labels, image, spec, creation
time) and its task (pid, status). `door.py` answers exactly those from pycri's own
records, on a socket of its own; `view.py` is the translation.
"""

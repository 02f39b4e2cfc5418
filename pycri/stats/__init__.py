"""Stats: the collector above the sandbox and container managers, and what it reads
through: usage samples and cAdvisor-named metrics made from the cgroup reader's facts
(pycri/cgroups.py), and network counters."""

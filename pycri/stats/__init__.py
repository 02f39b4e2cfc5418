"""Stats: the collector above the sandbox and container managers, and the pure
readers of cgroups, network counters and cAdvisor-named metrics it reads through."""

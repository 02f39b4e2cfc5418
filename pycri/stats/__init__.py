"""Resource usage of containers, read from their cgroups."""

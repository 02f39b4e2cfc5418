"""Pod sandboxes: the infra process, network namespace and shared pod files."""

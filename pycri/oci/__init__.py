"""OCI: runtime spec generation and the runc/crun CLI driver."""

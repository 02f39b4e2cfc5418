"""Containers: bundle, monitor, lifecycle, exec and logs."""

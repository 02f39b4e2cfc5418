"""Checkpoint/restore of containers with CRIU (CheckpointContainer, CheckpointPod, RestorePod)."""

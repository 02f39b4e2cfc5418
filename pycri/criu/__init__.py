"""What CRIU writes and needs: the checkpoint archive's layout (archive.py), whether
this node can checkpoint (support.py), and what a checkpointed process was allowed
(creds.py), its seccomp filters compared with the request's profile (bpf.py, with the
profile compiled by libseccomp.py). Below the container manager, which restores from
them; the RPC-level orchestration is pycri/checkpoint/."""

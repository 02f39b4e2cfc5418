"""NRI: the Node Resource Interface, pycri as the runtime side of containerd/nri plugins."""

"""Generated stubs of the NRI api (containerd/nri pkg/api); regenerate with hack/gen-proto.sh."""

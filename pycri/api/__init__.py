"""Generated stubs of the CRI runtime.v1 contract; regenerate with hack/gen-proto.sh."""

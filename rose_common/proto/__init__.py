"""Protocol buffers and generated gRPC stubs (regenerate with hack/gen-protos.sh)."""

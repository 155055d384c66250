"""intentserve.v1: generated protobuf and gRPC modules; regenerate with `make proto`."""

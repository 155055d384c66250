"""Generated gRPC contract of intentserve (see proto/intentserve/v1/*.proto)."""

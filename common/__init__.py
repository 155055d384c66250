"""intentserve.common: what the worker, the controller and the client library all use, so none of
them imports another for it: mutual TLS, request ids, the exception -> gRPC status interceptor and
its refused-field details, malformed-message checks, token-stream reading, JSON log lines and the
sandboxed chat template. It imports the contract's runtime (grpc, protobuf) but never a side."""

"""The worker's gRPC face: the engine loop thread, proto conversion, servicers and the server."""

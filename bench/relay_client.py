"""The relay benchmark's clients: one process holds many `Inference.Generate` streams on one
grpc.aio channel, so the clients' CPU is spent outside the process being measured.

    python bench/relay_client.py '{"target": "127.0.0.1:50051", "ca": "ca.crt",
        "server_name": "controller.d.intentserve", "streams": 256, "tokens": 100}'

With "identity" (a `TlsIdentity.to_dict` JSON file) it presents that certificate, as a caller
of a worker's server must. With "many": true its streams share one `Inference.GenerateMany` call
(a start command each; the router sends every request's news since its last message in one
message) instead of a `Generate` call each: the same requests, counted the same way. It
connects, prints `ready`, waits for a line on stdin, starts every stream at once and prints one
JSON line: tokens and messages received, streams that ended otherwise than with all their tokens
(and the first such error), and the seconds from the start to the last stream's end.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import grpc
from intentserve.common.tls import TlsIdentity, secure_aio_channel
from intentserve.v1 import inference_pb2, inference_pb2_grpc

CONNECT_TIMEOUT_S = 30.0


def _channel(config: dict) -> grpc.aio.Channel:
    name = config["server_name"]
    if "identity" in config:
        identity = TlsIdentity.from_dict(json.loads(Path(config["identity"]).read_text()))
        return secure_aio_channel(config["target"], identity, name)
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(config["ca"]).read_bytes())
    options = [("grpc.ssl_target_name_override", name)]
    return grpc.aio.secure_channel(config["target"], credentials, options=options)


async def _stream(stub, request, counts: dict) -> None:
    tokens = 0
    try:
        async for response in stub.Generate(request):
            tokens += len(response.token_ids)
            counts["messages"] += 1
    except grpc.RpcError as error:
        counts.setdefault("first_error", f"{error.code().name}: {error.details()}")
    counts["tokens"] += tokens
    if tokens != request.stop.max_tokens:
        counts["failed"] += 1


async def _many(stub, requests: list, counts: dict) -> None:
    """Every request on one GenerateMany call: a start command each, then its events read."""
    call = stub.GenerateMany()
    await call.initial_metadata()  # accepted (a refusal is read as sent)
    tokens = [0] * len(requests)
    for key, request in enumerate(requests):
        await call.write(inference_pb2.GenerateCommand(stream=key, start=request))
    await call.done_writing()
    try:
        async for message in call:
            counts["messages"] += 1
            for event in message.events:
                if event.HasField("output"):
                    tokens[event.stream] += len(event.output.token_ids)
                else:
                    error = event.error
                    counts.setdefault("first_error", f"{error.code}: {error.details}")
    except grpc.RpcError as error:
        counts.setdefault("first_error", f"{error.code().name}: {error.details()}")
    counts["tokens"] += sum(tokens)
    counts["failed"] += sum(n != r.stop.max_tokens for n, r in zip(tokens, requests, strict=True))


async def run(config: dict) -> dict:
    async with _channel(config) as channel:
        await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
        stub = inference_pb2_grpc.InferenceStub(channel)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        counts = {"tokens": 0, "messages": 0, "failed": 0}
        requests = [
            inference_pb2.GenerateRequest(
                prompt="hello",
                stop=inference_pb2.StopConditions(max_tokens=config["tokens"]),
            )
            for _ in range(config["streams"])
        ]
        start = time.perf_counter()
        if config.get("many"):
            await _many(stub, requests, counts)
        else:
            await asyncio.gather(*(_stream(stub, request, counts) for request in requests))
        return {**counts, "elapsed_s": time.perf_counter() - start}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(json.loads(sys.argv[1])))), flush=True)

"""What two gRPC hops cost per streamed message on this machine with none of the product's code:
an upstream process streams small messages (the worker's place), a relay process reads them on
its asyncio loop and streams them on to its caller (the controller's place: grpc.aio both ways,
the bytes passed through unparsed), and a client process reads them on one thread with
`SingleThreadedUnaryStream` (the blocking ControllerClient's way). Plaintext, where the served
path runs TLS on both hops: the figures are a floor for any served path built on gRPC here.

    python bench/grpc_floor.py                        # 1000 messages, one every 8 ms, 3 rounds
    python bench/grpc_floor.py --messages 200 --period-ms 2
    python bench/grpc_floor.py --streams 64 --period-ms 40   # 64 calls, a thread each

Each process's CPU (user and system) over a round, per message; the median of the rounds.
`bench/served_path.py` runs the in-process engine beside the chain at each concurrency, a
message per token and stream at the engine's pace: what the engine keeps beside the cheapest
gRPC served path with this client, the ceiling of served / engine there.
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, and as its own processes

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import threading
import time

import grpc
import grpc.experimental

from bench.served import cpu_s, free_port

MESSAGE = b"x" * 48  # about a serialized one-token response
SERVICE = "floor.Stream"


async def _serve(port: int, stream) -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def upstream(port: int) -> None:
    """Streams `count` messages, one every `period` seconds (the request: b"count period"), on
    ticks shared by every call (the tokens of one engine step leave together)."""

    async def stream(request: bytes, context):
        count, period = request.decode().split()
        period_s = float(period)
        due = (math.floor(time.perf_counter() / period_s) + 1) * period_s
        for _ in range(int(count)):
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            due += period_s
            yield MESSAGE

    await _serve(port, stream)


async def relay(port: int, upstream_port: int) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{upstream_port}")
    call = channel.unary_stream(f"/{SERVICE}/Stream")

    async def stream(request: bytes, context):
        async for message in call(request):
            yield message

    await _serve(port, stream)


def client(
    port: int,
    upstream_pid: int,
    relay_pid: int,
    messages: int,
    period_s: float,
    rounds: int,
    streams: int,
):
    """`rounds` rounds of `streams` concurrent calls of `messages` messages, a thread each."""
    options = ((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_stream(f"/{SERVICE}/Stream")
        for _ in call(b"20 0.001"):  # warm-up: connections, first calls
            pass
        print("ready", flush=True)
        samples = []
        for _ in range(rounds):
            counts = [0] * streams

            def read(i: int, counts: list[int] = counts) -> None:
                counts[i] = sum(1 for _ in call(f"{messages} {period_s}".encode()))

            threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
            before = cpu_s(upstream_pid), cpu_s(relay_pid), time.process_time()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            after = cpu_s(upstream_pid), cpu_s(relay_pid), time.process_time()
            assert counts == [messages] * streams, counts
            us = [(b - a) * 1e6 / sum(counts) for a, b in zip(before, after, strict=True)]
            samples.append(dict(zip(("upstream_us", "relay_us", "client_us"), us, strict=True)))
    print(json.dumps(samples), flush=True)


def _start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the floor's {args[0]} process did not start")
    return proc


class Chain:
    """The upstream and relay processes, started on entry; each `stream` call starts a client
    process that reads `rounds` rounds of `streams` concurrent calls of `messages` messages
    through them, and returns once that client has connected (the messages flow from then on)."""

    def __enter__(self) -> Chain:
        up_port, self._port = free_port(), free_port()
        self._procs = [_start("upstream", str(up_port))]
        try:
            self._procs.append(_start("relay", str(self._port), str(up_port)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def stream(
        self, messages: int, period_s: float, rounds: int = 1, streams: int = 1
    ) -> subprocess.Popen:
        upstream_pid, relay_pid = (p.pid for p in self._procs)
        args = (self._port, upstream_pid, relay_pid, messages, period_s, rounds, streams)
        proc = subprocess.Popen(
            [sys.executable, __file__, "client", *map(str, args)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if proc.stdout.readline().strip() != "ready":  # connected and warmed up
            proc.kill()
            raise RuntimeError("the floor's client process did not start")
        return proc

    @staticmethod
    def result(client_proc: subprocess.Popen, timeout_s: float) -> dict:
        """CPU microseconds per message of the upstream, the relay and the client: the median
        of the client's rounds, with every round's."""
        out, _ = client_proc.communicate(timeout=timeout_s)
        if client_proc.returncode:
            raise RuntimeError(f"the floor's client failed (exit {client_proc.returncode})")
        samples = json.loads(out.strip().splitlines()[-1])
        floor = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        return floor | {"rounds": samples}

    def __exit__(self, *exc_info) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()


def measure(
    messages: int = 1000, period_s: float = 0.008, rounds: int = 3, streams: int = 1
) -> dict:
    """The chain alone: `rounds` rounds of `streams` calls of `messages` messages, one every
    `period_s`."""
    with Chain() as chain:
        client = chain.stream(messages, period_s, rounds, streams)
        floor = chain.result(client, 60 + 2 * rounds * messages * period_s)
    return floor | {"messages": messages, "period_s": period_s, "streams": streams}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] in ("upstream", "relay", "client"):
        role, args = sys.argv[1], [float(a) if "." in a else int(a) for a in sys.argv[2:]]
        if role == "client":
            client(*args)
        else:
            asyncio.run(upstream(*args) if role == "upstream" else relay(*args))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--period-ms", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=1, help="concurrent calls, a thread each")
    args = parser.parse_args(argv)
    floor = measure(args.messages, args.period_ms / 1e3, args.rounds, args.streams)
    for i, r in enumerate(floor["rounds"], 1):
        print(
            f"round {i}: us of CPU per message: upstream {r['upstream_us']:.0f}, "
            f"relay {r['relay_us']:.0f}, client {r['client_us']:.0f}"
        )
    print(
        f"median: relay {floor['relay_us']:.0f} + client {floor['client_us']:.0f} us of CPU per "
        f"message ({args.streams} x {args.messages} messages, one every {args.period_ms:g} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

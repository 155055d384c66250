"""What one streamed message costs a gRPC server in Python: the sync server (a thread per stream,
woken per message, as the controller's Inference handlers are) against the asyncio server (every
stream a coroutine on one thread, fed once per step), the same 64 streams of small
GenerateResponse messages, one per stream every 10 ms (a decode step), read by a client in
another process. Server CPU microseconds per message, each mode in a fresh process.

    python bench/server_cost.py                    # 3 rounds, both modes alternately

Results go to `--out`, by default ~/.cache/intentserve/bench/server_cost.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intentserve.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402

from bench.out import default_out  # noqa: E402

STREAMS = 64
STEPS = 200
STEP_S = 0.01
MESSAGE = inference_pb2.GenerateResponse(request_id="r", token_ids=[1], text="x")


class SyncServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self) -> None:
        self.queues: list[queue.SimpleQueue] = []
        self.lock = threading.Lock()

    def Generate(self, request, context):
        items: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:
            self.queues.append(items)
        while (item := items.get()) is not None:
            yield item


class AsyncServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self) -> None:
        self.queues: list[asyncio.Queue] = []

    async def Generate(self, request, context):
        items: asyncio.Queue = asyncio.Queue()
        self.queues.append(items)
        while (item := await items.get()) is not None:
            yield item


def start_client(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--client", str(port)])


def run_client(port: int) -> None:
    stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    def read() -> None:
        for _ in stub.Generate(inference_pb2.GenerateRequest(prompt="x")):
            pass

    threads = [threading.Thread(target=read) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure_sync() -> float:
    servicer = SyncServicer()
    server = grpc.server(futures.ThreadPoolExecutor(STREAMS + 4))
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = start_client(port)
    while len(servicer.queues) < STREAMS:
        time.sleep(0.001)
    start = time.process_time()
    for _ in range(STEPS):
        for items in servicer.queues:
            items.put(MESSAGE)
        time.sleep(STEP_S)
    for items in servicer.queues:
        items.put(None)
    client.wait()
    cpu_s = time.process_time() - start
    server.stop(0)
    return cpu_s * 1e6 / (STREAMS * STEPS)


async def measure_async() -> float:
    servicer = AsyncServicer()
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = start_client(port)
    while len(servicer.queues) < STREAMS:
        await asyncio.sleep(0.001)
    loop = asyncio.get_running_loop()

    def put_all(item) -> None:
        for items in servicer.queues:
            items.put_nowait(item)

    def produce() -> None:  # another thread, as the mux reader is: one hand-over per step
        for _ in range(STEPS):
            loop.call_soon_threadsafe(put_all, MESSAGE)
            time.sleep(STEP_S)
        loop.call_soon_threadsafe(put_all, None)

    start = time.process_time()
    threading.Thread(target=produce).start()
    while client.poll() is None:
        await asyncio.sleep(0.05)
    cpu_s = time.process_time() - start
    await server.stop(0)
    return cpu_s * 1e6 / (STREAMS * STEPS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("sync", "async"), help="one measurement (internal)")
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=default_out("server_cost.json"))
    args = parser.parse_args(argv)
    if args.client is not None:
        run_client(args.client)
        return 0
    if args.mode is not None:
        cost = measure_sync() if args.mode == "sync" else asyncio.run(measure_async())
        print(json.dumps({"mode": args.mode, "server_cpu_us_per_message": cost}))
        return 0
    costs: dict[str, list[float]] = {"sync": [], "async": []}
    for r in range(args.rounds):
        for mode in costs:
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode], check=True, capture_output=True
            ).stdout
            costs[mode].append(
                json.loads(out.decode().splitlines()[-1])["server_cpu_us_per_message"]
            )
            print(f"round {r + 1} {mode:>5}: {costs[mode][-1]:.1f} us of server CPU per message")
    summary = {mode: statistics.median(values) for mode, values in costs.items()}
    print(
        f"median: sync {summary['sync']:.1f}, async {summary['async']:.1f} us per message "
        f"(async / sync {summary['async'] / summary['sync']:.2f})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": costs, "median": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

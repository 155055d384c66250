"""The router's own per-token CPU, in one process with no gRPC: what the relay benchmark's figure
(bench/relay.py, CPU per 1000 tokens of a router process) holds beside gRPC's write, measured
where a shared host's load moves the whole-process figure more than these parts weigh.

    python bench/relay_parts.py                        # 256 streams x 400 tokens, 3 rounds
    python bench/relay_parts.py --streams 64 --tokens 100 --rounds 1

- hand-off: a worker message's tokens handed to their streams (`mux_streams.hand_over`, as the
  mux's reader does, one message a token for every stream) and read by one task a stream
  (`AsyncMuxStream`), the task's wake-up included;
- metrics: a stream's responses through `RequestMetrics.aobserve` (time to first token, the gaps
  between tokens, the counts), less the same generator read bare.

CPU seconds of this process (`time.process_time`) per token, each round; the median of the
rounds. Results go to `--out` (bench/out.py), outside the source tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script

import argparse
import asyncio
import json
import os
import statistics
import time

from intentserve.common.streaming import END
from intentserve.controller.router.mux_streams import AsyncMuxStream, hand_over
from intentserve.controller.router.request_metrics import RequestMetrics
from intentserve.v1 import inference_pb2
from prometheus_client import CollectorRegistry

from bench.machine import describe, machine_info
from bench.out import default_out


class _Mux:
    """What a stream asks of its mux: only a cancel, which nothing here sends."""

    def cancel(self, key: int) -> bool:
        return True


async def hand_off_us(num_streams: int, num_tokens: int) -> float:
    """CPU microseconds per token from a message's hand-over to its stream's reader."""
    loop = asyncio.get_running_loop()
    streams = [AsyncMuxStream(_Mux(), key, loop) for key in range(num_streams)]
    token = inference_pb2.GenerateResponse(token_ids=[1], num_output_tokens=1)
    counts = [0] * num_streams

    async def read(i: int) -> None:
        async for _ in streams[i]:
            counts[i] += 1

    readers = [loop.create_task(read(i)) for i in range(num_streams)]
    await asyncio.sleep(0)  # every reader waits for its first token
    start_s = time.process_time()
    for _ in range(num_tokens):
        hand_over([(stream, token) for stream in streams])
        await asyncio.sleep(0)  # the readers run, and wait again
    hand_over([(stream, END) for stream in streams])
    await asyncio.gather(*readers)
    spent_s = time.process_time() - start_s
    if counts != [num_tokens] * num_streams:
        raise RuntimeError(f"a stream lost tokens: {sorted(set(counts))}")
    return spent_s * 1e6 / (num_streams * num_tokens)


async def metrics_us(num_tokens: int) -> float:
    """CPU microseconds per token that `aobserve` adds to reading a stream's responses."""
    metrics = RequestMetrics(CollectorRegistry(), deployment="d", model="m")

    async def responses():
        for i in range(num_tokens):
            yield inference_pb2.GenerateResponse(token_ids=[1], num_output_tokens=i + 1)

    async def read(stream) -> int:
        return sum([1 async for _ in stream])

    start_s = time.process_time()
    observed = await read(metrics.aobserve(responses()))
    measured_s = time.process_time() - start_s
    start_s = time.process_time()
    bare = await read(responses())
    bare_s = time.process_time() - start_s
    if observed != bare or bare != num_tokens:
        raise RuntimeError(f"tokens lost: {observed} observed, {bare} bare of {num_tokens}")
    return (measured_s - bare_s) * 1e6 / num_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=400, help="tokens of each stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=default_out("relay_parts.json"))
    args = parser.parse_args()
    result = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    print(describe(result["machine"]), flush=True)
    rounds = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        run = {
            "hand_off_us": asyncio.run(hand_off_us(args.streams, args.tokens)),
            "metrics_us": asyncio.run(metrics_us(args.streams * args.tokens)),
            "load": load,
        }
        rounds.append(run)
        print(
            f"round {i + 1}: hand-off {run['hand_off_us']:.2f} us/token, "
            f"metrics {run['metrics_us']:.2f} us/token (load {load:.2f})",
            flush=True,
        )
    result["rounds"] = rounds
    for key in ("hand_off_us", "metrics_us"):
        result[key] = statistics.median(r[key] for r in rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"median: hand-off {result['hand_off_us']:.2f}, metrics {result['metrics_us']:.2f} us "
        f"of CPU per token; wrote {args.out}"
    )


if __name__ == "__main__":
    main()

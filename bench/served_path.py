"""What the served path costs: the in-process engine against the same engine served by
`intentserve up` (1 replica, security on: TLS to the controller, mutual TLS to the worker),
side by side in one run on this machine, at 1, 32 and 64 concurrent streams, fp32 and bf16.

    python bench/served_path.py
    python bench/served_path.py --repeats 1 --max-tokens 32 --dtypes bfloat16   # a quick check
    python bench/served_path.py --client asyncio   # the streams on one event loop

Results go to `--out`, by default ~/.cache/intentserve/bench/served_path.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

Both sides run the same engine settings (paged, prefix caching off, the same KV budget and
scheduler limits) under the same thread budget (`--num-cpus` torch threads in the bench process;
`numCpus` for the worker). Each repeat measures the engine then the served path at every
concurrency, interleaved (the machine's speed drifts); the figure is the median of `--repeats`.
The workload: distinct chat prompts (the user's turn through the chat template), greedy, EOS
ignored, `--max-tokens` new tokens each. The client: `ControllerClient`, a thread per stream (the
default; the client's streams share one `GenerateMany` call), or `--client asyncio`:
`AsyncControllerClient`, every stream a task on one event loop, on one `GenerateMany` call.
The target: served >= 95% of the engine everywhere.
The guard: in fp32 the served greedy text of every prompt equals the engine's. Each row also
records CPU ms per 1000 tokens: of the bench process (the engine in-process; or the client) and
of the controller and the worker (spin-waiting torch threads count as busy).

What explains the gap (not a target): at 32 and more streams each repeat also runs the
in-process engine beside a side load, a process that takes the CPU the served run's controller
and client just took, in as many wake-ups as they take (`wakeups_per_token`: each hop's message
per worker step, and with the thread-per-stream client each stream's delivery), doing nothing
else; and beside the client's share alone. When the engine's rate beside the first is
close to the served rate, the served path loses to the two cores being shared, not to its own
code; the second bounds what any served path can reach here while its client shares the cores.
With the default client each repeat also runs the in-process engine beside the bare two-hop
gRPC chain of bench/grpc_floor.py (no product code, plaintext; a call and a client thread per
stream) streaming a message per token and stream at the engine's pace: what the engine keeps
beside the cheapest gRPC served path with a call per stream, the ceiling of served / engine for
a client of that shape (the default client's until it put its streams on one call, bdf11d9).
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse
import asyncio
import contextlib
import functools
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

import torch
from intentserve.client import AsyncControllerClient
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.registry import load_model
from intentserve.worker.runtime.heap import settle_heap

from bench.grpc_floor import Chain
from bench.machine import machine_info
from bench.out import default_out
from bench.served import Deployment
from bench.workloads import MAX_MODEL_LEN, MODEL, PROMPTS

TARGET = 0.95
SIDE_LOAD_MIN_STREAMS = 32
KV_BYTES = 1 << 30
MAX_NUM_BATCHED_TOKENS = 4096
MANIFEST = """\
apiVersion: intentserve/v1
kind: Deployment
metadata: {{name: served-path}}
spec:
  model: {{name: {model}, dtype: {dtype}}}
  replicas: 1
  resources: {{device: cpu, numCpus: {num_cpus}}}
  pagedAttention: {{mode: "on", prefixCaching: "off", kvCacheMemory: {kv_bytes}}}
  scheduler: {{maxNumSeqs: {streams}, maxModelLen: {max_model_len},
    maxNumBatchedTokens: {max_batched}, streamInterval: {stream_interval}}}
  controller: {{maxOutstandingPerWorker: {streams}}}
"""


def prompts(num: int) -> list[str]:
    """`num` distinct short user turns (about 50 tokens each through the chat template)."""
    return [f"Request {i}. {PROMPTS[i % len(PROMPTS)]}" for i in range(num)]


def engine_run(engine, texts: list[str], max_tokens: int) -> tuple[float, list[str]]:
    """Output tokens/s of the in-process engine on `texts` submitted together, and its texts."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate([Conversation.user(t) for t in texts], params)
    elapsed = time.perf_counter() - start
    assert all(len(o.new_token_ids) == max_tokens for o in outputs)
    return len(texts) * max_tokens / elapsed, [o.new_text for o in outputs]


def served_run(
    deployment: Deployment, texts: list[str], max_tokens: int
) -> tuple[float, list[str]]:
    """Output tokens/s of one concurrent greedy stream per text through the controller."""
    counts = [0] * len(texts)
    pieces: list[list[str]] = [[] for _ in texts]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for chunk in deployment.client.generate(
                texts[i], chat=True, max_tokens=max_tokens, ignore_eos=True, timeout_s=600
            ):
                counts[i] += len(chunk["token_ids"])
                pieces[i].append(chunk["text"])
        except BaseException as error:  # noqa: BLE001 - reported below, the run is void
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]!r}")
    assert counts == [max_tokens] * len(texts), counts
    return sum(counts) / elapsed, ["".join(p) for p in pieces]


class LoopStreams:
    """The served runs' streams through `AsyncControllerClient` (one event loop, one
    `GenerateMany` call): the loop and the client are kept from run to run, as the
    thread-per-stream client's channel is."""

    def __init__(self, deployment: Deployment) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = AsyncControllerClient(
            deployment.address, timeout_s=30, credentials=deployment.credentials
        )

    def run(self, texts: list[str], max_tokens: int) -> tuple[float, list[str]]:
        """Output tokens/s of one concurrent greedy stream per text through the controller."""
        return self._loop.run_until_complete(self._run(texts, max_tokens))

    async def _run(self, texts: list[str], max_tokens: int) -> tuple[float, list[str]]:
        async def one(text: str) -> tuple[int, str]:
            count, pieces = 0, []
            stream = self._client.generate(
                text, chat=True, max_tokens=max_tokens, ignore_eos=True, timeout_s=600
            )
            async for chunk in stream:
                count += len(chunk["token_ids"])
                pieces.append(chunk["text"])
            return count, "".join(pieces)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(t) for t in texts))
        elapsed = time.perf_counter() - start
        counts = [count for count, _ in results]
        assert counts == [max_tokens] * len(texts), counts
        return sum(counts) / elapsed, [text for _, text in results]

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()


SIDE_LOAD = """
import sys, time
period_s, work_s = float(sys.argv[1]), float(sys.argv[2])
while True:
    time.sleep(period_s)
    start = time.perf_counter()
    while time.perf_counter() - start < work_s:
        pass
"""


def side_load_run(
    engine,
    texts: list[str],
    max_tokens: int,
    served_tok_s: float,
    cpu_ms_per_1k: float,
    wakeups_per_token: float,
) -> float:
    """The engine's tok/s beside a process that wakes `wakeups_per_token` times per served token
    and spins `cpu_ms_per_1k` CPU ms per 1000 tokens in all, doing nothing else."""
    work_s = cpu_ms_per_1k / 1e6 / wakeups_per_token
    period_s = max(1.0 / (wakeups_per_token * served_tok_s) - work_s, 0.0)
    load = subprocess.Popen([sys.executable, "-c", SIDE_LOAD, str(period_s), str(work_s)])
    try:
        rate, _ = engine_run(engine, texts, max_tokens)
    finally:
        load.kill()
        load.wait()
    return rate


def wakeups_per_token(client: str, stream_interval: int, streams: int) -> tuple[float, float]:
    """Wake-ups per served token of the client's process and of the controller's, with every
    stream on one `GenerateMany` call: a worker step's outputs cross each hop in one message, so
    the controller's loop wakes for one message in and one out a step (2 / streams a token) and
    the client's reader once a step (1 / streams); with `client` "threads" each stream's caller
    thread also wakes for each delivery of its tokens (1 / stream_interval a token)."""
    per_step = 1 / streams
    callers = 1 / stream_interval if client == "threads" else 0.0
    return callers + per_step, 2 * per_step


def floor_run(chain: Chain, engine, texts: list[str], max_tokens: int, engine_tok_s: float):
    """The engine's tok/s beside the bare two-hop gRPC chain (bench/grpc_floor.py) streaming one
    message per token and stream (a call and a client thread each) at the engine's own pace,
    and the chain's CPU us per message."""
    streams = len(texts)
    client = chain.stream(int(max_tokens * 1.5) + 20, streams / engine_tok_s, streams=streams)
    rate, _ = engine_run(engine, texts, max_tokens)
    floor = chain.result(client, timeout_s=120 + 3 * max_tokens / engine_tok_s)
    return rate, {k: floor[k] for k in ("upstream_us", "relay_us", "client_us")}


def cpu_meter(deployment: Deployment | None) -> Callable[[int], dict[str, float]]:
    """Start counting CPU; the returned function gives CPU ms per 1000 tokens since then, of
    this process ("bench": the engine in-process, or the client) and, with a deployment, of its
    controller and its worker. Spin-waiting torch threads count too."""

    def now() -> dict[str, float]:
        times = {"bench": time.process_time()}
        if deployment is not None:
            times |= {
                "controller": deployment.controller_cpu_s(),
                "worker": deployment.worker_cpu_s(),
            }
        return times

    start = now()

    def per_1k_tokens(num_tokens: int) -> dict[str, float]:
        return {k: (v - start[k]) * 1e6 / num_tokens for k, v in now().items()}

    return per_1k_tokens


def _median_each(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def check_same_texts(served: list[str], engine: list[str]) -> None:
    """The guard: greedy fp32 text through the served path is the engine's, prompt by prompt."""
    for i, (a, b) in enumerate(zip(served, engine, strict=True)):
        if a != b:
            raise AssertionError(
                f"fp32 served text differs from the engine's for prompt {i}:\n"
                f"served {a!r}\nengine {b!r}"
            )


def build_engine(dtype: str, max_num_seqs: int):
    return (
        EngineBuilder()
        .paged_attention("on", prefix_caching="off")
        .kv_cache_memory(bytes=KV_BYTES)
        .scheduler(
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        )
        .build(loaded=load_model(MODEL, dtype=dtype))
    )


def measure_dtype(dtype: str, args: argparse.Namespace, work: Path) -> list[dict]:
    streams = max(args.concurrency)
    manifest = work / f"{dtype}.yaml"
    manifest.write_text(
        MANIFEST.format(
            model=MODEL,
            dtype=dtype,
            num_cpus=args.num_cpus,
            kv_bytes=KV_BYTES,
            streams=streams,
            max_model_len=MAX_MODEL_LEN,
            max_batched=MAX_NUM_BATCHED_TOKENS,
            stream_interval=args.stream_interval,
        )
    )
    engine = build_engine(dtype, streams)
    settle_heap()  # as the served worker does once its engine is built
    texts = prompts(streams)
    rates: dict[tuple[str, int], list[float]] = {}
    cpu_ms: dict[tuple[str, int], list[dict[str, float]]] = {}
    floors: dict[int, list[dict[str, float]]] = {}
    with Deployment(manifest, work) as d, contextlib.ExitStack() as stack, Chain() as chain:
        serve = functools.partial(served_run, d)
        if args.client == "asyncio":
            serve = stack.enter_context(contextlib.closing(LoopStreams(d))).run
        engine_run(engine, texts[:2], 8)  # warm-up: kernels, caches, connections
        serve(texts[:2], 8)
        for r in range(args.repeats):
            for n in args.concurrency:
                engine_cpu = cpu_meter(None)
                engine_rate, engine_texts = engine_run(engine, texts[:n], args.max_tokens)
                cpu_ms.setdefault(("engine", n), []).append(engine_cpu(n * args.max_tokens))
                served_cpu = cpu_meter(d)
                served_rate, served_texts = serve(texts[:n], args.max_tokens)
                cpu_ms.setdefault(("served", n), []).append(served_cpu(n * args.max_tokens))
                if dtype == "float32":
                    check_same_texts(served_texts, engine_texts)
                rates.setdefault(("engine", n), []).append(engine_rate)
                rates.setdefault(("served", n), []).append(served_rate)
                side = ""
                if args.client == "threads":  # the chain has a client thread per stream, as it
                    rate, floor = floor_run(chain, engine, texts[:n], args.max_tokens, engine_rate)
                    rates.setdefault(("floor", n), []).append(rate)
                    floors.setdefault(n, []).append(floor)
                    side += f", engine beside the bare gRPC chain {rate:6.1f}"
                if n >= SIDE_LOAD_MIN_STREAMS:
                    used = cpu_ms[("served", n)][-1]
                    client, controller = wakeups_per_token(args.client, args.stream_interval, n)
                    for name, cpu, wakeups in (
                        ("side_load", used["controller"] + used["bench"], client + controller),
                        ("client_load", used["bench"], client),
                    ):
                        rate = side_load_run(
                            engine, texts[:n], args.max_tokens, served_rate, cpu, wakeups
                        )
                        rates.setdefault((name, n), []).append(rate)
                        side += f", engine beside {name} {rate:6.1f}"
                print(
                    f"[{dtype}] repeat {r + 1} n={n:<3} engine {engine_rate:6.1f} tok/s "
                    f"served {served_rate:6.1f} ({served_rate / engine_rate:.3f}){side}",
                    flush=True,
                )
    rows = []
    for n in args.concurrency:
        engine_tok_s = statistics.median(rates[("engine", n)])
        served_tok_s = statistics.median(rates[("served", n)])
        rows.append(
            {
                "dtype": dtype,
                "concurrency": n,
                "engine_tok_s": engine_tok_s,
                "served_tok_s": served_tok_s,
                "engine_runs_tok_s": rates[("engine", n)],
                "served_runs_tok_s": rates[("served", n)],
                "served_over_engine": served_tok_s / engine_tok_s,
                "engine_cpu_ms_per_1k_tokens": _median_each(cpu_ms[("engine", n)]),
                "served_cpu_ms_per_1k_tokens": _median_each(cpu_ms[("served", n)]),
            }
        )
        if n in floors:
            rows[-1]["floor_cpu_us_per_message"] = _median_each(floors[n])
        for name in ("side_load", "client_load", "floor"):
            if (name, n) in rates:
                side_tok_s = statistics.median(rates[(name, n)])
                rows[-1] |= {
                    f"{name}_engine_tok_s": side_tok_s,
                    f"{name}_engine_runs_tok_s": rates[(name, n)],
                    f"{name}_engine_over_engine": side_tok_s / engine_tok_s,
                }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--concurrency", default="1,32,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=2, help="torch threads on both sides")
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="the deployment's spec.scheduler.streamInterval (tokens per streamed message); "
        "the targets are judged at the default, 1",
    )
    parser.add_argument(
        "--client",
        choices=("threads", "asyncio"),
        default="threads",
        help="the served runs' client: ControllerClient with a thread per stream (the default), "
        "or AsyncControllerClient with every stream a task on one event loop (both put a "
        "client's streams on one GenerateMany call)",
    )
    parser.add_argument("--out", type=Path, default=default_out("served_path.json"))
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    torch.set_num_threads(args.num_cpus)
    work = Path(tempfile.mkdtemp(prefix="intentserve-bench-"))
    os.environ["INTENTSERVE_HOME"] = str(work / "home")
    rows = [row for dtype in args.dtypes.split(",") for row in measure_dtype(dtype, args, work)]
    interval = f" streamInterval {args.stream_interval}" if args.stream_interval != 1 else ""
    interval += f" {args.client} client" if args.client != "threads" else ""
    for row in rows:
        ok = "met" if row["served_over_engine"] >= TARGET else "not met"
        cpu = row["served_cpu_ms_per_1k_tokens"]
        print(
            f"{row['dtype']:>8} n={row['concurrency']:<3}{interval} engine "
            f"{row['engine_tok_s']:6.1f} "
            f"served {row['served_tok_s']:6.1f} tok/s  served / engine "
            f"{row['served_over_engine']:.3f}  ({ok}, target {TARGET:.2f}); CPU ms per 1k "
            f"tokens: engine {row['engine_cpu_ms_per_1k_tokens']['bench']:.0f}, served: worker "
            f"{cpu['worker']:.0f} controller {cpu['controller']:.0f} client {cpu['bench']:.0f}"
            + (
                f"; the engine beside the controller's and client's side load: "
                f"{row['side_load_engine_over_engine']:.3f} of the engine, beside the client's "
                f"alone: {row['client_load_engine_over_engine']:.3f}"
                if "side_load_engine_tok_s" in row
                else ""
            )
            + (
                f"; the engine beside the bare gRPC chain: {row['floor_engine_over_engine']:.3f} "
                f"of the engine (relay {row['floor_cpu_us_per_message']['relay_us']:.0f} + client "
                f"{row['floor_cpu_us_per_message']['client_us']:.0f} us of CPU per message)"
                if "floor_engine_tok_s" in row
                else ""
            )
        )
    summary = {
        "workload": {"max_tokens": args.max_tokens, "greedy": True, "ignore_eos": True},
        "num_cpus": args.num_cpus,
        "repeats": args.repeats,
        "stream_interval": args.stream_interval,
        "client": args.client,
        "target": TARGET,
        "rows": rows,
        "machine": machine_info(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the HTTP front end costs: served throughput of concurrent greedy streams through the
OpenAI-compatible API (HTTPS, SSE) against the same streams through gRPC (TLS), on one deployment,
measured alternately in one run on this machine.

    python bench/http_api.py
    python bench/http_api.py --rounds 1 --repeats 1 --max-tokens 32   # a quick check

Results go to `--out`, by default ~/.cache/intentserve/bench/http_api.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

One `intentserve up` (security on, an API key) serves both. Each round times `--streams`
concurrent greedy streams of `--max-tokens` tokens (EOS ignored) through gRPC and through HTTP,
in alternating order (the machine's speed drifts), `--repeats` times each, keeping the median.
The target: HTTP reaches at least 90% of gRPC's tokens/s at 32 streams.
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse
import functools
import json
import os
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import httpx2 as httpx
from intentserve.client.credentials import folder_for

from bench.out import default_out
from bench.security import MANIFEST, timed_streams
from bench.served import Deployment
from bench.workloads import PROMPTS

API_KEY = "bench-key"
MODEL = "smollm2-135m"


def http_streams(deployment: Deployment, streams: int, max_tokens: int) -> float:
    """Output tokens per second of `streams` concurrent greedy SSE streams (the token count of
    each is the usage its last chunk reports)."""
    verify = ssl.create_default_context(cafile=str(folder_for(deployment.address) / "ca.crt"))
    url = f"https://127.0.0.1:{deployment.http_port}/v1/completions"
    headers = {"authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    counts = [0] * streams
    errors: list[BaseException] = []
    with httpx.Client(verify=verify, headers=headers, limits=limits, timeout=600) as client:

        def run(i: int) -> None:
            body = {
                "model": MODEL,
                "prompt": PROMPTS[i % len(PROMPTS)],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                with client.stream("POST", url, json=body) as response:
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            usage = json.loads(line[6:]).get("usage")
                            if usage:
                                counts[i] = usage["completion_tokens"]
            except BaseException as error:  # noqa: BLE001 - reported below, the run is void
                errors.append(error)

        elapsed = _concurrently(run, streams)
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]!r}")
    assert sum(counts) == streams * max_tokens, counts
    return sum(counts) / elapsed


def measured(run: Callable[[], float], deployment: Deployment, max_tokens: int, streams: int):
    """Tokens/s, and the controller's and this client's CPU milliseconds per 1000 tokens."""
    controller, client = deployment.controller_cpu_s(), time.process_time()
    tok_s = run()
    per_1k = 1000 * 1000 / (streams * max_tokens)
    return (
        tok_s,
        (deployment.controller_cpu_s() - controller) * per_1k,
        (time.process_time() - client) * per_1k,
    )


def _concurrently(run: Callable[[int], None], streams: int) -> float:
    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=default_out("http_api.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="intentserve-bench-"))
    os.environ["INTENTSERVE_HOME"] = str(work / "home")
    (work / "keys").write_text(f"{API_KEY}\n")
    manifest = work / "http.yaml"
    security = f"{{apiKeysFile: {work / 'keys'}}}"
    manifest.write_text(MANIFEST.format(streams=args.streams, security=security))
    paths = {
        "grpc": lambda d, n: timed_streams(d, args.streams, n),
        "http": lambda d, n: http_streams(d, args.streams, n),
    }
    rounds = []
    with Deployment(manifest, work, api_key=API_KEY) as d:
        for measure in paths.values():
            measure(d, 8)  # warm-up: kernels, caches, connections
        for r in range(args.rounds):
            order = ("grpc", "http") if r % 2 == 0 else ("http", "grpc")
            result = {}
            for path in order:
                run = functools.partial(paths[path], d, args.max_tokens)
                runs = [
                    measured(run, d, args.max_tokens, args.streams) for _ in range(args.repeats)
                ]
                result[path] = {
                    "tok_s": statistics.median(r[0] for r in runs),
                    "runs_tok_s": [r[0] for r in runs],
                    "controller_cpu_ms_per_1k_tokens": statistics.median(r[1] for r in runs),
                    "client_cpu_ms_per_1k_tokens": statistics.median(r[2] for r in runs),
                }
            result["http_over_grpc"] = result["http"]["tok_s"] / result["grpc"]["tok_s"]
            rounds.append(result)
            print(
                f"round {r + 1} ({' then '.join(order)}): "
                + ", ".join(
                    f"{p} {result[p]['tok_s']:.0f} tok/s (controller "
                    f"{result[p]['controller_cpu_ms_per_1k_tokens']:.0f} CPU ms / 1k tokens, "
                    f"client {result[p]['client_cpu_ms_per_1k_tokens']:.0f})"
                    for p in ("grpc", "http")
                )
                + f"; HTTP / gRPC {result['http_over_grpc']:.3f}",
                flush=True,
            )
    ratios = [r["http_over_grpc"] for r in rounds]
    summary = {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rounds": rounds,
        "http_over_grpc_median": statistics.median(ratios),
        "machine": os.uname().machine,
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"HTTP reaches {summary['http_over_grpc_median']:.1%} of gRPC's served throughput at "
        f"{args.streams} streams (median of {len(ratios)} rounds; target: at least 90%); "
        f"written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What security costs on the request path: served throughput of one deployment with TLS, worker
identity, the admin token and an API key (the default) against the same deployment in plaintext
(`spec.security.insecure: true`), measured in one run, alternating, on this machine.

    python bench/security.py
    python bench/security.py --rounds 1 --streams 8 --max-tokens 32   # a quick check

Results go to `--out`, by default ~/.cache/intentserve/bench/security.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

Each round starts `intentserve up` once per mode (order alternating between rounds, as the
machine's speed drifts), warms it up, then times `--streams` concurrent greedy streams of
`--max-tokens` tokens (EOS ignored) through the controller, `--repeats` times, keeping the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.out import default_out  # noqa: E402
from bench.served import Deployment  # noqa: E402
from bench.workloads import PROMPTS  # noqa: E402

MANIFEST = """\
apiVersion: intentserve/v1
kind: Deployment
metadata: {{name: bench}}
spec:
  replicas: 1
  resources: {{device: cpu, numCpus: 2}}
  pagedAttention: {{mode: "on", kvCacheMemory: 256Mi}}
  scheduler: {{maxNumSeqs: {streams}, maxModelLen: 512}}
  controller: {{maxOutstandingPerWorker: {streams}}}
  security: {security}
"""


def timed_streams(deployment: Deployment, streams: int, max_tokens: int) -> float:
    """Output tokens per second of `streams` concurrent greedy streams."""
    counts = [0] * streams
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for chunk in deployment.client.generate(
                PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, ignore_eos=True, timeout_s=600
            ):
                counts[i] += len(chunk["token_ids"])
        except BaseException as error:  # noqa: BLE001 - reported below, the run is void
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]!r}")
    assert sum(counts) == streams * max_tokens, counts
    return sum(counts) / elapsed


def measure(mode: str, args: argparse.Namespace, work: Path) -> dict:
    security = "{insecure: true}" if mode == "insecure" else f"{{apiKeysFile: {work / 'keys'}}}"
    manifest = work / f"{mode}.yaml"
    manifest.write_text(MANIFEST.format(streams=args.streams, security=security))
    with Deployment(manifest, work, api_key="bench-key" if mode == "secure" else None) as d:
        timed_streams(d, args.streams, 8)  # warm-up: kernels, caches, connections
        controller_s, client_s = d.controller_cpu_s(), time.process_time()
        rates = [timed_streams(d, args.streams, args.max_tokens) for _ in range(args.repeats)]
        per_1k = 1000 * 1000 / (args.streams * args.max_tokens * args.repeats)
        controller_ms = (d.controller_cpu_s() - controller_s) * per_1k
        client_ms = (time.process_time() - client_s) * per_1k
    return {
        "tok_s": statistics.median(rates),
        "runs_tok_s": rates,
        "controller_cpu_ms_per_1k_tokens": controller_ms,
        "client_cpu_ms_per_1k_tokens": client_ms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=default_out("security.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="intentserve-bench-"))
    os.environ["INTENTSERVE_HOME"] = str(work / "home")
    (work / "keys").write_text("bench-key\n")
    rounds = []
    for r in range(args.rounds):
        order = ("secure", "insecure") if r % 2 == 0 else ("insecure", "secure")
        result = {mode: measure(mode, args, work) for mode in order}
        result["secure_over_insecure"] = result["secure"]["tok_s"] / result["insecure"]["tok_s"]
        rounds.append(result)
        print(
            f"round {r + 1} ({' then '.join(order)}): secure {result['secure']['tok_s']:.0f} "
            f"tok/s, insecure {result['insecure']['tok_s']:.0f} tok/s, secure / insecure "
            f"{result['secure_over_insecure']:.3f}; controller CPU ms / 1k tokens: secure "
            f"{result['secure']['controller_cpu_ms_per_1k_tokens']:.0f}, insecure "
            f"{result['insecure']['controller_cpu_ms_per_1k_tokens']:.0f}",
            flush=True,
        )
    ratios = [r["secure_over_insecure"] for r in rounds]
    summary = {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "rounds": rounds,
        "secure_over_insecure_median": statistics.median(ratios),
        "cost_percent": 100 * (1 - statistics.median(ratios)),
        "machine": os.uname().machine,
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"security costs {summary['cost_percent']:.1f}% of served throughput at "
        f"{args.streams} streams (median of {len(ratios)} rounds; target: at most 5%); "
        f"written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Structured-outputs benchmark: engine throughput at 32 streams (SmolLM2, float32, paged) with a
JSON schema on every request against the same requests unconstrained, in one process, on one
warmed engine, the two workloads of each round interleaved (target, issue 39: within 20%).

    python bench/structured.py                   # 3 rounds, 32 streams, 64 tokens each; writes
                                                 # ~/.cache/intentserve/bench/structured.json
    python bench/structured.py --quick           # a smaller run to check the script

Both workloads are greedy with EOS ignored. The schema's last field is a string of at least
4000 characters, so no constrained request completes its grammar before max_tokens: both run
every request to max_tokens and differ only in the grammar's cost (one bitmask per step for
every row, the mask applied to the logits, the token fed back). The schema is compiled once (the
first request) and copied from the cache for every other; the compile is timed apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intentserve.worker.engine.constraint import Constraint  # noqa: E402
from intentserve.worker.engine.grammar import GrammarCompiler  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402

from bench.machine import machine_info  # noqa: E402
from bench.out import default_out  # noqa: E402
from bench.sampler import build_engine, throughput  # noqa: E402
from bench.workloads import MODEL  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "story": {"type": "string", "minLength": 4000},
    },
    "required": ["name", "age", "tags", "story"],
    "additionalProperties": False,
}
FREE = SamplingParams(max_tokens=1, ignore_eos=True)
RUNS = {
    "free": FREE,
    "schema": dataclasses.replace(FREE, constraint=Constraint.json_schema(SCHEMA)),
}


def compile_s(engine) -> dict[str, float]:
    """Seconds to build the vocabulary, then to compile the schema, then a cache hit."""
    compiler = GrammarCompiler(engine.tokenizer)
    times = {}
    for name, constraint in (
        ("vocabulary_and_first_schema", Constraint.json_schema({"type": "integer"})),
        ("schema", RUNS["schema"].constraint),
        ("schema_cached", RUNS["schema"].constraint),
    ):
        start = time.perf_counter()
        compiler.compile(constraint)
        times[name] = time.perf_counter() - start
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 streams, 8 tokens, 1 round")
    parser.add_argument("--out", type=Path, default=default_out("structured.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.max_tokens, args.rounds = 4, 8, 1
    for flag in ("concurrency", "max_tokens", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1")
    engine = build_engine(args.concurrency)
    compiles = compile_s(engine)
    tokens_per_s: dict[str, list[float]] = {name: [] for name in RUNS}
    for params in RUNS.values():  # warm-up: each path once
        throughput(engine, params, args.concurrency, 4)
    for _ in range(args.rounds):
        for name, params in RUNS.items():
            tokens_per_s[name].append(throughput(engine, params, args.concurrency, args.max_tokens))
            print(f"  {name:<8} {tokens_per_s[name][-1]:8.1f} tok/s", flush=True)
    median = {name: statistics.median(values) for name, values in tokens_per_s.items()}
    ratio = median["schema"] / median["free"]
    results = {
        "machine": machine_info(),
        "workload": {
            "model": MODEL,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "schema": SCHEMA,
        },
        "compile_s": compiles,
        "tokens_per_s": tokens_per_s,
        "median_tokens_per_s": median,
        "ratio_schema_over_free": ratio,
    }
    for name, value in median.items():
        print(f"{name:<8} {value:8.1f} tok/s  (rounds: {tokens_per_s[name]})")
    print(f"schema / free {ratio:.3f}; compile (s): {compiles}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sampler benchmark: engine throughput at 32 streams (SmolLM2, float32, paged) with this tree's
sampler against the sampler of a baseline git revision (the per-row sampler it replaced), in one
process, on one warmed engine, the runs of each round interleaved.

    python bench/sampler.py                      # 3 rounds, 32 streams, 64 tokens each; writes
                                                 # ~/.cache/intentserve/bench/sampler.json
    python bench/sampler.py --quick              # a smaller run to check the script

Workloads: `greedy` and `sampled` (temperature 0.8, top_p 0.95) use none of the new options:
this sampler against the baseline's (target: within 3%). `options` is `sampled` plus logprobs=5
and the presence, frequency and repetition penalties on every request, on this sampler, against
the baseline's `sampled` (target: within 15%).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intentserve.worker.engine.sampler import Sampler, StepSamples  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.model.registry import load_model  # noqa: E402

from bench.machine import machine_info  # noqa: E402
from bench.out import default_out  # noqa: E402
from bench.workloads import (  # noqa: E402
    MAX_MODEL_LEN,
    MODEL,
    PROMPTS,
    Models,
    _bytes_per_token,
    _engine,
)

BASELINE = "5c8e1e4"  # the last commit with the per-row sampler
GREEDY = SamplingParams(max_tokens=1, ignore_eos=True)
SAMPLED = dataclasses.replace(GREEDY, temperature=0.8, top_p=0.95)
OPTIONS = dataclasses.replace(
    SAMPLED, logprobs=5, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1
)
# (name, sampler, params): "new" is this tree's sampler, "old" the baseline's.
RUNS = [
    ("greedy/old", "old", GREEDY),
    ("greedy/new", "new", GREEDY),
    ("sampled/old", "old", SAMPLED),
    ("sampled/new", "new", SAMPLED),
    ("options/new", "new", OPTIONS),
]


class BaselineSampler:
    """The baseline revision's sampler, loaded from git, behind this tree's call."""

    def __init__(self, revision: str) -> None:
        try:
            source = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{revision}:worker/engine/sampler.py"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError) as error:
            message = f"--baseline: cannot read {revision}'s sampler from git: {error}"
            raise SystemExit(message) from None
        # The kernels it imports have moved rooms since (worker/kernels/, issue 44); same names.
        source = source.replace(
            "intentserve.worker.attention.cpu_kernels", "intentserve.worker.kernels"
        )
        module = types.ModuleType("baseline_sampler")
        sys.modules[module.__name__] = module  # NOTE: its dataclasses look their module up
        exec(compile(source, f"{revision}:worker/engine/sampler.py", "exec"), module.__dict__)
        self._sampler = module.Sampler()

    def sample(self, logits, seq_ids, params, histories=None):
        samples = self._sampler.sample(logits, seq_ids, params)
        return StepSamples(samples.tokens, samples.failures)

    def forget(self, seq_id: str) -> None:
        self._sampler.forget(seq_id)


def build_engine(concurrency: int):
    models = Models(load_model(MODEL, dtype="float32"), None)
    return _engine(
        models, "paged", concurrency, concurrency * MAX_MODEL_LEN * _bytes_per_token(models)
    )


def throughput(engine, params: SamplingParams, concurrency: int, max_tokens: int) -> float:
    """Output tokens/s for `concurrency` requests submitted together, run to completion."""
    params = dataclasses.replace(params, max_tokens=max_tokens)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.new_token_ids) == max_tokens for o in outputs), "a request ended early"
    return concurrency * max_tokens / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the old sampler")
    parser.add_argument("--quick", action="store_true", help="4 streams, 8 tokens, 1 round")
    parser.add_argument("--out", type=Path, default=default_out("sampler.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.max_tokens, args.rounds = 4, 8, 1
    for flag in ("concurrency", "max_tokens", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1")
    engine = build_engine(args.concurrency)
    samplers = {
        "old": BaselineSampler(args.baseline),
        "new": Sampler(engine.runner.sampler.eos_token_ids),
    }
    tokens_per_s: dict[str, list[float]] = {name: [] for name, _, _ in RUNS}
    for _, which, params in RUNS:  # warm-up: each path once
        engine.runner.sampler = samplers[which]
        throughput(engine, params, args.concurrency, 4)
    for _ in range(args.rounds):
        for name, which, params in RUNS:
            engine.runner.sampler = samplers[which]
            tokens_per_s[name].append(throughput(engine, params, args.concurrency, args.max_tokens))
            print(f"  {name:<12} {tokens_per_s[name][-1]:8.1f} tok/s", flush=True)
    median = {name: statistics.median(values) for name, values in tokens_per_s.items()}
    ratios = {
        "greedy new/old": median["greedy/new"] / median["greedy/old"],
        "sampled new/old": median["sampled/new"] / median["sampled/old"],
        "options new / sampled old": median["options/new"] / median["sampled/old"],
    }
    results = {
        "machine": machine_info(),
        "workload": {
            "model": MODEL,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "baseline": args.baseline,
        },
        "tokens_per_s": tokens_per_s,
        "median_tokens_per_s": median,
        "ratios": ratios,
    }
    for name, value in median.items():
        print(f"{name:<12} {value:8.1f} tok/s  (rounds: {tokens_per_s[name]})")
    for name, value in ratios.items():
        print(f"{name:<26} {value:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

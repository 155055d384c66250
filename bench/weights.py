"""Weight formats side by side in one run: quality against the dequantized model, resident
weight memory, the projections alone and engine throughput, per format.

    python bench/weights.py                 # full run
    python bench/weights.py --quick         # a smaller run to check the script
    python bench/weights.py --quick --formats dequantized,w8a8   # two formats only

Results go to `--out`, by default ~/.cache/intentserve/bench/weights.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

Quality, for each of int8, int4 and w8a8 against dequantized (same dtype, same run):
- greedy agreement over 32 fixed prompts x 64 tokens, batches of 8 (prefill rows take the
  dequantize path, decode steps the int kernels): the mean fraction of tokens identical until the
  first divergence, and the fraction identical overall (position by position);
- perplexity of a fixed passage (bench/weights_text.py, one forward over the whole passage).

Speed, per format: tok/s at each concurrency and, at 32 streams and more, the fraction of the
compute roofline measured in the same run: dequantized and int4 against the dtype's dense matmul
ceiling (int4 has no int4 dot product here: its steps over 16 rows compute in the dtype), int8
and w8a8 against the int8 matmul ceiling (`torch._int_mm`, the int8 dot-product instructions,
which w8a8 runs on and int8's weight-only kernels do not).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intentserve.worker.engine.builder import EngineBuilder  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.model.registry import load_model  # noqa: E402

from bench.machine import machine_info  # noqa: E402
from bench.out import default_out  # noqa: E402
from bench.weights_text import PASSAGE, PROMPTS  # noqa: E402
from bench.workloads import (  # noqa: E402
    FLOP_PER_TOKEN,
    MAX_MODEL_LEN,
    MODEL,
    Models,
    int8_matmul_ops,
    matmul_flops,
    projection_floor,
)

FORMATS = ("dequantized", "int8", "int4", "w8a8")
QUALITY_BATCH = 8


class CausalAttention:
    """One sequence, no cache: the model's attention interface over the whole passage."""

    def forward(self, layer_idx, q, k, v, meta=None):  # [T, H, D] each (k, v: KV heads)
        group = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1).repeat_interleave(group, dim=0),
            v.transpose(0, 1).repeat_interleave(group, dim=0),
            is_causal=True,
        )
        return out.transpose(0, 1)


def engine(models: Models, fmt: str, max_num_seqs: int):
    c = models.ours.config
    bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * models.ours.dtype.itemsize
    return (
        EngineBuilder()
        .weights(fmt)
        .paged_attention("on", prefix_caching="off")
        .kv_cache_memory(bytes=max_num_seqs * MAX_MODEL_LEN * bytes_per_token)
        .scheduler(
            max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs, max_num_batched_tokens=4096
        )
        .build(loaded=models.ours)
    )


def greedy_tokens(models: Models, fmt: str, prompts: list[str], max_tokens: int) -> list[list]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    outputs = engine(models, fmt, QUALITY_BATCH).generate(prompts, params)
    return [list(o.new_token_ids) for o in outputs]


def agreement(reference: list[list[int]], got: list[list[int]]) -> dict:
    until, overall, total = [], 0, 0
    for ref, ids in zip(reference, got, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(ref, ids, strict=True)) if a != b), len(ref))
        until.append(first / len(ref))
        overall += sum(a == b for a, b in zip(ref, ids, strict=True))
        total += len(ref)
    return {
        "until_first_divergence": sum(until) / len(until),
        "identical_overall": overall / total,
        "num_prompts_identical": sum(u == 1.0 for u in until),
    }


@torch.inference_mode()
def perplexity(models: Models, max_tokens: int | None = None) -> tuple[float, int]:
    """Of PASSAGE, or of its first `max_tokens` tokens; with the number of tokens scored."""
    model = models.ours.model
    ids = torch.tensor(models.ours.tokenizer.encode(PASSAGE)[:max_tokens])
    hidden = model(ids, torch.arange(len(ids)), CausalAttention(), None)
    logits = model.compute_logits(hidden[:-1])
    nll = F.cross_entropy(logits, ids[1:])
    return math.exp(nll.item()), len(ids)


def throughput(models: Models, fmt: str, concurrency: int, max_tokens: int) -> float:
    eng = engine(models, fmt, concurrency)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    eng.generate([PROMPTS[0]], SamplingParams(max_tokens=4))  # warm-up
    start = time.perf_counter()
    outputs = eng.generate([PROMPTS[i % len(PROMPTS)] for i in range(concurrency)], params)
    elapsed = time.perf_counter() - start
    assert all(len(o.new_token_ids) == max_tokens for o in outputs)
    return concurrency * max_tokens / elapsed


def measure_format(fmt: str, dtype: str, args, reference: list[list[int]] | None) -> dict:
    models = Models(load_model(MODEL, dtype=dtype), None)
    row: dict = {"format": fmt, "dtype": dtype}
    tokens = greedy_tokens(models, fmt, PROMPTS[: args.num_prompts], args.quality_tokens)
    row["tokens"] = tokens
    row["weight_bytes"] = engine(models, fmt, 1).realized.cache.weight_bytes
    row["perplexity"], row["passage_tokens"] = perplexity(models, args.passage_tokens)
    if reference is not None:
        row["agreement"] = agreement(reference, tokens)
    if args.no_speed:
        return row
    row["projections_ms"] = {
        n: projection_floor(models, n, args.repeats) * 1e3 for n in args.concurrency
    }
    row["tokens_per_s"] = {n: throughput(models, fmt, n, args.max_tokens) for n in args.concurrency}
    return row


ROOFLINE_MIN_STREAMS = 32


def rooflines(dtype: str, seconds: float = 3.0) -> dict:
    """The compute ceilings of this run, as tok/s of the model (FLOP_PER_TOKEN per token), each
    timed over `seconds`."""
    dense = matmul_flops(getattr(torch, dtype), seconds=seconds)
    int8 = int8_matmul_ops(seconds=seconds)
    return {
        dtype: {"ops_per_s": dense, "tokens_per_s": dense / FLOP_PER_TOKEN},
        "int8": {"ops_per_s": int8, "tokens_per_s": int8 / FLOP_PER_TOKEN},
    }


def roofline_fractions(row: dict, ceilings: dict) -> None:
    """Each format against its own kernels' ceiling, at ROOFLINE_MIN_STREAMS streams and more."""
    against = "int8" if row["format"] in ("int8", "w8a8") else row["dtype"]
    roof = ceilings[against]["tokens_per_s"]
    row["roofline"] = against
    row["roofline_fraction"] = {
        n: rate / roof for n, rate in row["tokens_per_s"].items() if n >= ROOFLINE_MIN_STREAMS
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--concurrency", default="1,32,64")
    parser.add_argument("--max-tokens", type=int, default=64, help="per stream, for tok/s")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="4 prompts x 8 tokens, 1 and 4 streams, one round, 128 tokens of the passage",
    )
    parser.add_argument("--no-speed", action="store_true", help="quality and memory only")
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="dequantized first (the others are judged against it), then any of the others",
    )
    parser.add_argument("--out", type=Path, default=default_out("weights.json"))
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    formats = args.formats.split(",")
    if formats[0] != "dequantized" or not set(formats) <= set(FORMATS):
        parser.error(f"--formats: dequantized first, then any of {', '.join(FORMATS[1:])}")
    args.num_prompts, args.quality_tokens = len(PROMPTS), 64
    args.passage_tokens, args.repeats = None, 7  # the whole passage; the projections' rounds
    if args.quick:  # the smallest run that measures every part once: the script's test
        args.concurrency, args.max_tokens, args.num_prompts, args.quality_tokens = [1, 4], 8, 4, 8
        args.passage_tokens, args.repeats = 128, 1
    results: dict = {
        "machine": {
            **machine_info(),
            "num_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "workload": {
            "num_prompts": args.num_prompts,
            "quality_tokens": args.quality_tokens,
            "max_tokens": args.max_tokens,
            "concurrency": [] if args.no_speed else args.concurrency,
        },
        "weight_formats": [],
    }
    if not args.no_speed:
        results["roofline"] = rooflines(args.dtype, seconds=0.5 if args.quick else 3.0)
        for name, ceiling in results["roofline"].items():
            print(
                f"[{name}] matmul ceiling {ceiling['ops_per_s'] / 1e9:.0f} GOP/s "
                f"= {ceiling['tokens_per_s']:.0f} tok/s roofline",
                flush=True,
            )
    reference = None
    for fmt in formats:
        row = measure_format(fmt, args.dtype, args, reference)
        if not args.no_speed:
            roofline_fractions(row, results["roofline"])
        if fmt == "dequantized":
            reference = row["tokens"]
        del row["tokens"]
        results["weight_formats"].append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decode attention alone: the compiled paged kernel on a batch step's shapes, against reading
the same bytes, in one run.

    python bench/decode_attention.py                  # SmolLM2's shapes, 64 sequences, bf16
    python bench/decode_attention.py --sequences 32 --rounds 5

Three timings of one step (every layer's attention once), medians of alternated rounds:
- cold: each layer has its own K/V cache and a 512 MB pass over other memory runs before every
  round, so the K/V come from DRAM, as in an engine step;
- hot: one layer's caches, read again and again (from the CPU caches);
- read: `torch.sum` over as many bytes as the step's K/V, contiguous: the memory's own pace on
  this machine now.
The contexts are the served bench's (chat prompts of about 49 tokens, up to 128 new tokens);
each sequence's blocks are scattered over its cache as an engine's are after a while.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intentserve.worker.kernels import paged_decode_kernel  # noqa: E402

from bench.machine import describe, machine_info  # noqa: E402

# SmolLM2-135M: 30 layers, 9 query heads over 3 kv heads of 64.
LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16
FIRST_CONTEXT, LAST_CONTEXT = 49, 177  # the served bench's contexts, prompt to last token


class Step:
    """One decode step's attention inputs for `sequences` sequences over `layers` caches."""

    def __init__(self, sequences: int, layers: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        span = LAST_CONTEXT - FIRST_CONTEXT
        self.context = torch.tensor(
            [FIRST_CONTEXT + (i * 37) % span for i in range(sequences)], dtype=torch.int64
        )
        self.width = -(-LAST_CONTEXT // BLOCK)
        num_blocks = sequences * self.width
        self.tables = (
            torch.randperm(num_blocks, generator=gen).reshape(sequences, self.width).contiguous()
        )
        shape = (num_blocks * BLOCK, KV_HEADS, HEAD_DIM)
        self.caches = [
            (
                torch.randn(shape, generator=gen).to(torch.bfloat16),
                torch.randn(shape, generator=gen).to(torch.bfloat16),
            )
            for _ in range(layers)
        ]
        self.q = torch.randn(sequences, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        self.out = torch.empty_like(self.q)
        self.kv_bytes_per_layer = int(self.context.sum()) * KV_HEADS * HEAD_DIM * 2 * 2

    def run(self, kernel, layers: int = LAYERS) -> float:
        """Seconds for `layers` layers' attention (cycling over the caches it has)."""
        sequences = self.q.shape[0]
        start = time.perf_counter()
        for layer in range(layers):
            k_cache, v_cache = self.caches[layer % len(self.caches)]
            code = kernel.bf16(
                self.q.data_ptr(), HEADS * HEAD_DIM, k_cache.data_ptr(), v_cache.data_ptr(),
                self.tables.data_ptr(), self.width, self.context.data_ptr(), sequences, HEADS,
                KV_HEADS, HEAD_DIM, BLOCK, 0, HEAD_DIM**-0.5, self.out.data_ptr(),
            )  # fmt: skip
            if code:
                raise RuntimeError(f"the kernel refused the step (code {code})")
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.sequences < 1 or args.rounds < 1:
        parser.error("--sequences and --rounds must be at least 1")

    kernel = paged_decode_kernel()
    cold, hot = Step(args.sequences, LAYERS), Step(args.sequences, 1)
    step_bytes = cold.kv_bytes_per_layer * LAYERS
    flat = torch.ones(step_bytes // 4, dtype=torch.float32)  # the step's K/V bytes, contiguous
    other = torch.ones(512 * 2**20 // 4, dtype=torch.float32)
    times: dict[str, list[float]] = {"cold": [], "hot": [], "read": []}
    hot.run(kernel, 3)
    print(f"{describe(machine_info())}; {torch.get_num_threads()} threads", flush=True)
    for _ in range(args.rounds):
        other.add_(1.0)  # the caches' lines out of the CPU caches
        times["cold"].append(cold.run(kernel))
        times["hot"].append(hot.run(kernel))
        other.add_(1.0)
        start = time.perf_counter()
        flat.sum()
        times["read"].append(time.perf_counter() - start)
    result = {
        "machine": machine_info(),
        "sequences": args.sequences,
        "kv_bytes_per_step": step_bytes,
        **{f"{name}_ms": 1e3 * statistics.median(t) for name, t in times.items()},
    }
    for name in ("cold", "hot", "read"):
        ms = result[f"{name}_ms"]
        print(f"{name:>5}: {ms:7.2f} ms a step  {step_bytes / ms / 1e6:6.1f} GB/s of K/V")
    print(f"cold / read: {result['cold_ms'] / result['read_ms']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

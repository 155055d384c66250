"""Markdown tables from bench/engine.py results: the throughput table of one run, and the
issue's targets judged on every run given (the VM's speed drifts, so one run is not enough).

    python bench/report.py bench/results/2026-11-30-cpu-kernel/run*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def throughput_table(run: dict) -> str:
    lines = [
        "| dtype | concurrent | paged tok/s | default tok/s | transformers tok/s "
        "| paged / transformers | paged / roofline | projections alone, ms/step "
        "| ceiling / transformers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in run["throughput"]:
        lines.append(
            f"| {row['dtype']} | {row['concurrency']} | {row['paged']:.0f} | {row['default']:.0f} "
            f"| {row['transformers']:.0f} | {row['paged_vs_transformers']:.2f}x "
            f"| {row['paged_roofline_fraction']:.0%} | {row['projection_floor_ms']:.1f} "
            f"| {row['ceiling_vs_transformers']:.2f}x |"
        )
    return "\n".join(lines)


def _row(run: dict, dtype: str, n: int) -> dict:
    return next(r for r in run["throughput"] if r["dtype"] == dtype and r["concurrency"] == n)


def _met(ok: list[bool]) -> str:
    return "yes" if all(ok) else ("no" if not any(ok) else f"in {sum(ok)} of {len(ok)} runs")


def targets_table(runs: list[dict]) -> str:
    def each(fmt, fn) -> str:
        return " / ".join(fmt.format(fn(run)) for run in runs)

    rows = []
    for dtype in ("float32", "bfloat16"):
        ratios = [_row(r, dtype, 32)["paged_vs_transformers"] for r in runs]
        ceilings = each("{:.2f}x", lambda r, d=dtype: _row(r, d, 32)["ceiling_vs_transformers"])
        rows.append(
            (f"paged >= 3x transformers at 32 requests, {dtype}",
             " / ".join(f"{x:.2f}x" for x in ratios),
             _met([x >= 3 for x in ratios]) + f" (projections alone allow {ceilings})")
        )  # fmt: skip
    fractions = [_row(r, "bfloat16", 64)["paged_roofline_fraction"] for r in runs]
    rows.append(
        ("paged >= 40% of the bf16 roofline at 64 requests",
         " / ".join(f"{f:.0%}" for f in fractions), _met([f >= 0.4 for f in fractions]))
    )  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        ratios = [_row(r, dtype, 1)["paged_vs_transformers"] for r in runs]
        rows.append(
            (f"single-request decode no slower than transformers, {dtype}",
             " / ".join(f"{x:.2f}x" for x in ratios), _met([x >= 1 for x in ratios]))
        )  # fmt: skip
    waste = runs[0]["kv_waste"]
    rows.append(
        ("paged KV waste under 4% (blocks of 16, the default)",
         f"{waste['paged']['waste_of_reserved']:.2%} of reserved (deterministic)",
         _met([waste["paged"]["waste_of_reserved"] < 0.04])
         + f"; {waste['paged_block_8']['waste_of_reserved']:.2%} with blocks of 8")
    )  # fmt: skip
    ratio = [r["admission"]["ratio"] for r in runs]
    rows.append(
        ("paged admits >= 3x the contiguous cache's sequences",
         " / ".join(f"{x:.0f}x" for x in ratio), _met([x >= 3 for x in ratio]))
    )  # fmt: skip
    runs_label = " / ".join(str(i + 1) for i in range(len(runs)))
    lines = [f"| target (issue 3) | runs {runs_label} | met |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


# Issue 13's decode targets (bench/workloads.py holds the same numbers for the live run).
SINGLE_STREAM_TARGET = 1.25
ROOFLINE_TARGETS = {32: 0.55, 64: 0.65}


def decode_targets_table(runs: list[dict]) -> str:
    """Issue 13: one stream against the weight-streaming limit, batches against the bf16
    roofline; empty for runs recorded before the single-stream section existed."""
    if not all("single_stream" in run for run in runs):
        return ""
    rows = []
    for dtype in ("float32", "bfloat16"):
        ratios = [run["single_stream"][dtype]["ratio_to_limit"] for run in runs]
        rows.append(
            (f"one stream within {SINGLE_STREAM_TARGET}x of the weight-streaming limit, {dtype}",
             " / ".join(f"{x:.2f}x" for x in ratios),
             _met([x <= SINGLE_STREAM_TARGET for x in ratios]))
        )  # fmt: skip
    for n, target in ROOFLINE_TARGETS.items():
        fractions = [_row(run, "bfloat16", n)["paged_roofline_fraction"] for run in runs]
        rows.append(
            (f"paged >= {target:.0%} of the bf16 roofline at {n} requests",
             " / ".join(f"{f:.0%}" for f in fractions), _met([f >= target for f in fractions]))
        )  # fmt: skip
    runs_label = " / ".join(str(i + 1) for i in range(len(runs)))
    lines = [f"| target (issue 13) | runs {runs_label} | met |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="results JSON files, run 1 first")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    first = runs[0]
    roof = first["roofline"]
    print(
        f"roofline (run 1): {roof['float32']['matmul_flops'] / 1e9:.0f} GFLOP/s fp32, "
        f"{roof['bfloat16']['matmul_flops'] / 1e9:.0f} GFLOP/s bf16 = "
        f"{roof['float32']['tokens_per_s']:.0f} and {roof['bfloat16']['tokens_per_s']:.0f} tok/s\n"
    )
    print(throughput_table(first) + "\n")
    print(targets_table(runs))
    decode = decode_targets_table(runs)
    if decode:
        print("\n" + decode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Markdown tables from bench/engine.py results: the throughput table of one run, and the
issue's targets judged on every run given (the VM's speed drifts, so one run is not enough).
Given bench/served_path.py results, the served path's targets instead; given bench/security.py
results, security's cost, run by run and pooled over every alternated round given.
A bench/weights.py result given among them gets its own table (weight formats).

    python bench/report.py ~/.cache/intentserve/bench/engine.json   # the latest local run
    python bench/report.py ~/.cache/intentserve/bench/weights.json
    git worktree add /tmp/runs bench-results   # the recorded runs (docs/benchmarks.md)
    python bench/report.py /tmp/runs/2026-11-30-cpu-kernel/run*.json
    python bench/report.py /tmp/runs/*/security*.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe  # noqa: E402

SECURITY_COST_TARGET = 0.05  # issue 10: at most 5% of served throughput at 32 streams


def throughput_table(run: dict) -> str:
    """One row per dtype and concurrency; without transformers (`--skip-hf`), its columns go."""
    with_hf = all("transformers" in row for row in run["throughput"])
    hf_head = "| transformers tok/s | paged / transformers " if with_hf else ""
    hf_tail = "| ceiling / transformers " if with_hf else ""
    lines = [
        f"| dtype | concurrent | paged tok/s | default tok/s {hf_head}| paged / roofline "
        f"| projections alone, ms/step {hf_tail}|",
        "| --- " * (9 if with_hf else 6) + "|",
    ]
    for row in run["throughput"]:
        hf = (
            f"| {row['transformers']:.0f} | {row['paged_vs_transformers']:.2f}x " if with_hf else ""
        )
        ceiling = f"| {row['ceiling_vs_transformers']:.2f}x " if with_hf else ""
        lines.append(
            f"| {row['dtype']} | {row['concurrency']} | {row['paged']:.0f} | {row['default']:.0f} "
            f"{hf}| {row['paged_roofline_fraction']:.0%} | {row['projection_floor_ms']:.1f} "
            f"{ceiling}|"
        )
    return "\n".join(lines)


def machine_lines(runs: list[dict]) -> str:
    """What each run ran on, where the result says (bench/machine.py); one line when all agree."""
    described = [describe(r["machine"]) for r in runs if isinstance(r.get("machine"), dict)]
    if not described:
        return ""
    if len(set(described)) == 1:
        return f"machine: {described[0]}"
    return "\n".join(f"machine, run {i}: {line}" for i, line in enumerate(described, 1))


def _row(run: dict, dtype: str, n: int) -> dict:
    return next(r for r in run["throughput"] if r["dtype"] == dtype and r["concurrency"] == n)


def met(ok: list[bool]) -> str:
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
             met([x >= 3 for x in ratios]) + f" (projections alone allow {ceilings})")
        )  # fmt: skip
    fractions = [_row(r, "bfloat16", 64)["paged_roofline_fraction"] for r in runs]
    rows.append(
        ("paged >= 40% of the bf16 roofline at 64 requests",
         " / ".join(f"{f:.0%}" for f in fractions), met([f >= 0.4 for f in fractions]))
    )  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        ratios = [_row(r, dtype, 1)["paged_vs_transformers"] for r in runs]
        rows.append(
            (f"single-request decode no slower than transformers, {dtype}",
             " / ".join(f"{x:.2f}x" for x in ratios), met([x >= 1 for x in ratios]))
        )  # fmt: skip
    waste = runs[0]["kv_waste"]
    rows.append(
        ("paged KV waste under 4% (blocks of 16, the default)",
         f"{waste['paged']['waste_of_reserved']:.2%} of reserved (deterministic)",
         met([waste["paged"]["waste_of_reserved"] < 0.04])
         + f"; {waste['paged_block_8']['waste_of_reserved']:.2%} with blocks of 8")
    )  # fmt: skip
    ratio = [r["admission"]["ratio"] for r in runs]
    rows.append(
        ("paged admits >= 3x the contiguous cache's sequences",
         " / ".join(f"{x:.0f}x" for x in ratio), met([x >= 3 for x in ratio]))
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
             met([x <= SINGLE_STREAM_TARGET for x in ratios]))
        )  # fmt: skip
    for n, target in ROOFLINE_TARGETS.items():
        fractions = [_row(run, "bfloat16", n)["paged_roofline_fraction"] for run in runs]
        rows.append(
            (f"paged >= {target:.0%} of the bf16 roofline at {n} requests",
             " / ".join(f"{f:.0%}" for f in fractions), met([f >= target for f in fractions]))
        )  # fmt: skip
    runs_label = " / ".join(str(i + 1) for i in range(len(runs)))
    lines = [f"| target (issue 13) | runs {runs_label} | met |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    bounds = []
    for n in ROOFLINE_TARGETS:
        found = [_row(run, "bfloat16", n).get("memory_ceiling_roofline_fraction") for run in runs]
        if all(f is not None for f in found):
            bounds.append(f"{n} requests " + " / ".join(f"{f:.0%}" for f in found))
    if bounds:
        lines += [
            "",
            "The memory's bound on those fractions (the weights and K/V a step reads, over the "
            "run's read bandwidth, as a share of the same roofline): " + "; ".join(bounds) + ".",
        ]
    return "\n".join(lines)


def served_path_targets_table(runs: list[dict]) -> str:
    """bench/served_path.py results: served / in-process engine per dtype and concurrency, at
    the runs' stream interval and with their client (each named unless it is the default: every
    token, a thread per stream)."""
    target = runs[0]["target"]
    intervals = [run.get("stream_interval", 1) for run in runs]
    if len(set(intervals)) > 1:
        raise ValueError(f"runs at different stream intervals: {', '.join(map(str, intervals))}")
    clients = [run.get("client", "threads") for run in runs]
    if len(set(clients)) > 1:
        raise ValueError(f"runs with different clients: {', '.join(clients)}")
    setting = f", streamInterval {intervals[0]}" if intervals[0] != 1 else ""
    setting += f", {clients[0]} client" if clients[0] != "threads" else ""
    rows = []
    for first in runs[0]["rows"]:
        key = (first["dtype"], first["concurrency"])
        ratios = [
            next(r for r in run["rows"] if (r["dtype"], r["concurrency"]) == key)[
                "served_over_engine"
            ]
            for run in runs
        ]
        streams = f"{key[1]} stream{'s' * (key[1] != 1)}"
        rows.append(
            (f"served >= {target:.0%} of the in-process engine, {key[0]}, {streams}{setting}",
             " / ".join(f"{x:.3f}" for x in ratios), met([x >= target for x in ratios]))
        )  # fmt: skip
    runs_label = " / ".join(str(i + 1) for i in range(len(runs)))
    lines = [f"| target (issue 13) | runs {runs_label} | met |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + side_load_table(runs) + floor_table(runs)


def _rows_measured_with(runs: list[dict], field: str):
    """(dtype, concurrency) and that row of every run, for the rows every run measured `field`
    in, in the first run's order."""
    for first in runs[0]["rows"]:
        key = (first["dtype"], first["concurrency"])
        picked = [
            next(r for r in run["rows"] if (r["dtype"], r["concurrency"]) == key) for run in runs
        ]
        if all(field in r for r in picked):
            yield key, picked


def side_load_table(runs: list[dict]) -> str:
    """Not a target: the in-process engine beside a side load that takes what the served run's
    controller and client took, next to served / engine (runs recorded with it only)."""
    rows = []
    for key, picked in _rows_measured_with(runs, "side_load_engine_over_engine"):
        served = " / ".join(f"{r['served_over_engine']:.3f}" for r in picked)
        side = " / ".join(f"{r['side_load_engine_over_engine']:.3f}" for r in picked)
        client = " / ".join(f"{r.get('client_load_engine_over_engine', 0):.3f}" for r in picked)
        rows.append(f"| {key[0]}, {key[1]} streams | {served} | {side} | {client} |")
    columns = (
        "served / engine",
        "engine beside the controller's and client's CPU / engine",
        "engine beside the client's CPU alone / engine",
    )
    return _explaining_table(runs, "the gap explained", columns, rows)


def floor_table(runs: list[dict]) -> str:
    """Not a target: the in-process engine beside the bare two-hop gRPC chain
    (bench/grpc_floor.py) against served / engine, with the chain's relay and client CPU per
    message next to the served path's controller and client CPU per token (rows recorded with
    it only)."""
    rows = []
    for key, picked in _rows_measured_with(runs, "floor_engine_over_engine"):
        served = " / ".join(f"{r['served_over_engine']:.3f}" for r in picked)
        floor = " / ".join(f"{r['floor_engine_over_engine']:.3f}" for r in picked)
        chain = " / ".join(
            f"{(f := r['floor_cpu_us_per_message'])['relay_us'] + f['client_us']:.0f}"
            for r in picked
        )
        ours = " / ".join(
            f"{(c := r['served_cpu_ms_per_1k_tokens'])['controller'] + c['bench']:.0f}"
            for r in picked
        )
        streams = f"{key[1]} stream{'s' * (key[1] != 1)}"
        rows.append(f"| {key[0]}, {streams} | {served} | {floor} | {chain} | {ours} |")
    columns = (
        "served / engine",
        "engine beside the bare two-hop gRPC chain / engine",
        "the chain's relay + client, us of CPU per message",
        "the served path's controller + client, us of CPU per token",
    )
    return _explaining_table(runs, "the ceiling of a gRPC served path", columns, rows)


def _explaining_table(runs: list[dict], title: str, columns: tuple[str, ...], rows: list[str]):
    """A table under the targets (after a blank line), headed `title (runs 1 / 2 / ...)` and
    `columns`; "" without rows."""
    if not rows:
        return ""
    runs_label = " / ".join(str(i + 1) for i in range(len(runs)))
    head = [
        "",
        "",
        f"| {title} (runs {runs_label}) | " + " | ".join(columns) + " |",
        "|" + " --- |" * (len(columns) + 1),
    ]
    return "\n".join(head + rows)


def security_table(runs: list[dict], names: list[str]) -> str:
    """bench/security.py results: each run's cost (the median of its alternated rounds), then
    every round of every run pooled: one `up` per mode a round, so a round's ratio carries the
    noise between two starts of the same deployment; the pooled median, with a bootstrap 95%
    interval (10,000 resamples of the rounds, a fixed seed), is what the target is judged on."""
    lines = [
        "| run | streams | rounds: secure / insecure | cost (median of its rounds) |",
        "| --- | --- | --- | --- |",
    ]
    pooled = []
    for name, run in zip(names, runs, strict=True):
        ratios = [r["secure_over_insecure"] for r in run["rounds"]]
        if run["streams"] == 32:
            pooled += ratios
        lines.append(
            f"| {name} | {run['streams']} | {' / '.join(f'{x:.3f}' for x in ratios)} "
            f"| {run['cost_percent']:.1f}% |"
        )
    if not pooled:
        return "\n".join(lines)
    costs = [1 - x for x in pooled]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(costs, k=len(costs))) for _ in range(10_000))
    low, high = medians[249], medians[9_749]
    median = statistics.median(costs)
    ok = median <= SECURITY_COST_TARGET and high <= SECURITY_COST_TARGET
    pooled_runs = sum(r["streams"] == 32 for r in runs)
    lines += [
        "",
        f"Pooled at 32 streams: {len(costs)} rounds from {pooled_runs} "
        f"run{'s' * (pooled_runs != 1)}; cost median {median:.1%} "
        f"(bootstrap 95% interval {low:.1%} to {high:.1%}), "
        f"mean {statistics.mean(costs):.1%}, rounds above {SECURITY_COST_TARGET:.0%}: "
        f"{sum(c > SECURITY_COST_TARGET for c in costs)}. Target (at most "
        f"{SECURITY_COST_TARGET:.0%}, the interval's top included): "
        f"{'met' if ok else 'not met'}.",
    ]
    return "\n".join(lines)


def weights_table(run: dict) -> str:
    """One row per weight format: resident weights, quality against dequantized, speed."""
    concurrency = run["workload"]["concurrency"]
    roofline_lines: list[str] = []
    streams = "".join(f" | tok/s x{n}" for n in concurrency)
    projections = "".join(f" | proj. ms x{n}" for n in concurrency)
    lines = [
        f"| format | weights MiB | identical until divergence | identical overall "
        f"| perplexity{streams}{projections} |",
        "| --- " * (5 + 2 * len(concurrency)) + "|",
    ]
    for row in run["weight_formats"]:
        if "roofline_fraction" in row:
            for n, fraction in row["roofline_fraction"].items():
                roofline_lines.append(
                    f"| {row['format']} | {n} | {row['roofline']} | {fraction:.1%} |"
                )
        agreement = row.get("agreement")
        until = f"{agreement['until_first_divergence']:.1%}" if agreement else "reference"
        overall = f"{agreement['identical_overall']:.1%}" if agreement else "reference"
        speed = "".join(f" | {row['tokens_per_s'][str(n)]:.0f}" for n in concurrency)
        proj = "".join(f" | {row['projections_ms'][str(n)]:.1f}" for n in concurrency)
        lines.append(
            f"| {row['format']} ({row['dtype']}) | {row['weight_bytes'] / 2**20:.0f} | {until} "
            f"| {overall} | {row['perplexity']:.3f}{speed}{proj} |"
        )
    w = run["workload"]
    lines.append(
        f"\n{w['num_prompts']} prompts x {w['quality_tokens']} greedy tokens against dequantized; "
        f"perplexity over {run['weight_formats'][0]['passage_tokens']} tokens of a fixed passage."
    )
    if roofline_lines:
        ceilings = ", ".join(
            f"{name} {c['ops_per_s'] / 1e9:.0f} GOP/s" for name, c in run["roofline"].items()
        )
        lines += [
            "",
            f"| format | streams | against the ceiling of | fraction (ceilings: {ceilings}) |",
            "| --- | --- | --- | --- |",
            *roofline_lines,
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="results JSON files, run 1 first")
    args = parser.parse_args(argv)
    loaded = [json.loads(path.read_text()) for path in args.runs]
    machines = machine_lines(loaded)
    if machines:
        print(machines + "\n")
    for run in (r for r in loaded if "weight_formats" in r):
        print(weights_table(run) + "\n")
    security = [(str(p), r) for p, r in zip(args.runs, loaded, strict=True) if "rounds" in r]
    if security:
        print(security_table([r for _, r in security], [p for p, _ in security]) + "\n")
    runs = [r for r in loaded if "weight_formats" not in r and "rounds" not in r]
    if not runs:
        return 0
    first = runs[0]
    if "served_over_engine" in first.get("rows", [{}])[0]:  # bench/served_path.py
        print(served_path_targets_table(runs))
        return 0
    roof = first["roofline"]
    print(
        f"roofline (run 1): {roof['float32']['matmul_flops'] / 1e9:.0f} GFLOP/s fp32, "
        f"{roof['bfloat16']['matmul_flops'] / 1e9:.0f} GFLOP/s bf16 = "
        f"{roof['float32']['tokens_per_s']:.0f} and {roof['bfloat16']['tokens_per_s']:.0f} tok/s\n"
    )
    print(throughput_table(first) + "\n")
    if all("transformers" in row for run in runs for row in run["throughput"]):
        print(targets_table(runs))  # issue 3's targets are ratios to transformers
    decode = decode_targets_table(runs)
    if decode:
        print("\n" + decode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

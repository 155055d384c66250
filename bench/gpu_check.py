"""The GPU check (`make gpu-check`): one command sized for a short lease of one GPU.

    make gpu-check OUT=/tmp/out            # on a CUDA machine: writes gpu_check.json and .md
    make gpu-check DRY_RUN=1 OUT=/tmp/out  # everything but CUDA, on the CPU, at small shapes

The parts run in order of value (PARTS), each on its own: a part that fails is recorded with its
error and the rest still run, so a lease is never wasted on the first failure.

1. gpu_tests: the `gpu` test layer, each CUDA paged backend against float64 attention;
2. engine_parity: greedy tokens on the device (mode on, each paged backend, float32) equal to
   the CPU engine's and transformers' on the same seeded SmolLM2-135M- and Llama-3.2-1B-shaped
   weights; how far bf16 agrees;
3. throughput: decode tokens/s of the 1B shape in bf16 at 1, 64 and 256 streams, against HBM
   streaming of weights plus KV and the bf16 matmul ceiling, both measured in the same run;
   the graph-replayed step against the eager one;
4. served_over_tls: the controller here, the worker a process of its own, mutual TLS, no Ray:
   READY only once the realized paged cache is verified, a request through it; `backend: flash`
   without vllm-flash-attn refused naming it;
5. flex_vs_triton: decode attention at the 1B shape, the Triton paged kernel beside torch's
   FlexAttention, both checked against float64 first: which `auto` should order first.

A dry run shrinks the shapes (the kernels run under Triton's interpreter) and reports the same
fields, so CI checks the script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ (the seeded checkpoints) and bench/
from bench.gpu_attention import flex_vs_triton  # noqa: E402
from bench.gpu_parts import SCRATCH, PartFailed, engine_parity, gpu_tests, host_facts  # noqa: E402
from bench.gpu_report import write_report  # noqa: E402
from bench.gpu_served import served_over_tls  # noqa: E402
from bench.gpu_throughput import throughput  # noqa: E402

Part = Callable[[str], dict]  # device ("cuda"; "cpu": the dry run) -> findings

PARTS: dict[str, Part] = {
    "gpu_tests": gpu_tests,
    "engine_parity": engine_parity,
    "throughput": throughput,
    "served_over_tls": served_over_tls,
    "flex_vs_triton": flex_vs_triton,
}


def run_part(fn: Part, device: str) -> dict:
    start = time.perf_counter()
    try:
        result = {"ok": True, **fn(device)}
    except PartFailed as exc:
        result = {"ok": False, "error": str(exc), **exc.found}
    except Exception as exc:  # noqa: BLE001 - a failed part is a result; the others still run
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the JSON and table")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, at small shapes")
    args = parser.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it with --dry-run (make gpu-check DRY_RUN=1)")
    device = "cpu" if args.dry_run else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for name, fn in PARTS.items():
        print(f"[gpu-check] {name} ...", flush=True)
        results[name] = run_part(fn, device)
        outcome = "ok" if results[name]["ok"] else f"FAILED: {results[name]['error'][:300]}"
        print(f"[gpu-check] {name}: {outcome} ({results[name]['seconds']} s)", flush=True)
    report = {"host": host_facts(device), "dry_run": args.dry_run, "parts": results}
    write_report(report, args.out)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    failed = [name for name, result in results.items() if not result["ok"]]
    print(f"[gpu-check] wrote {args.out}/gpu_check.json and gpu_check.md; failed: {failed or 0}")
    return 1 if failed else 0


if __name__ == "__main__":
    if "--dry-run" in sys.argv:
        # Triton's interpreter is chosen when triton is first imported (worker/attention/
        # triton_kernels.py); nothing has imported it yet.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())

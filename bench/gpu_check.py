"""The GPU check (`make gpu-check`): one command sized for a short lease of one GPU.

    make gpu-check OUT=/tmp/out            # on a CUDA machine: writes gpu_check.json and .md
    make gpu-check DRY_RUN=1 OUT=/tmp/out  # everything but CUDA, on the CPU, at small shapes

Each part runs on its own; a part that fails is recorded with its error and the rest still run,
so a lease is never wasted on the first failure. The parts:

1. the `gpu` test layer (each CUDA backend against float64 attention over paged blocks);
2. the engine with `mode: on`, for every paged backend the worker has: greedy tokens against
   transformers on the same seeded weights, SmolLM2-135M's and Llama-3.2-1B's shapes (float32,
   so that a tie cannot split them), and how far bf16 agrees;
3. a controller and one worker over gRPC with mutual TLS, no Ray: READY only once the realized
   paged cache is verified; `backend: flash` where vllm-flash-attn is missing fails naming it;
4. tokens/s at 1, 32 and 256 streams for the 1B shape in bf16, with the share of the HBM
   weight-streaming limit at one stream and of the bf16 matmul ceiling at 256, both measured
   in the same run.

A dry run shrinks the shapes (the kernels run under Triton's interpreter) and reports the same
fields, so CI checks the script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ (the seeded checkpoints) and bench/
from bench.gpu_parts import (  # noqa: E402
    SCRATCH,
    engine_parity,
    gpu_tests,
    host_facts,
    served_over_tls,
    throughput,
    write_report,
)


def run_part(results: dict, name: str, fn, *args) -> None:
    start = time.perf_counter()
    print(f"[gpu-check] {name} ...", flush=True)
    try:
        results[name] = {"ok": True, **fn(*args)}
    except Exception as exc:  # noqa: BLE001 - a failed part is a result; the others still run
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    results[name]["seconds"] = round(time.perf_counter() - start, 1)
    print(f"[gpu-check] {name}: {'ok' if results[name]['ok'] else 'FAILED'}", flush=True)


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
    results: dict = {"host": host_facts(device), "dry_run": args.dry_run}
    run_part(results, "gpu_tests", gpu_tests, device)
    run_part(results, "engine_parity", engine_parity, device)
    run_part(results, "served_over_tls", served_over_tls, device)
    run_part(results, "throughput", throughput, device)
    write_report(results, args.out)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"[gpu-check] wrote {args.out}/gpu_check.json and gpu_check.md; failed: {failed or 0}")
    return 1 if failed else 0


if __name__ == "__main__":
    if "--dry-run" in sys.argv:
        # Triton's interpreter is chosen when triton is first imported (worker/attention/
        # triton_kernels.py); nothing has imported it yet.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())

"""The GPU check (`make gpu-check`): one command sized for a short lease of one GPU.

    make gpu-check OUT=/tmp/out            # on a CUDA machine: writes gpu_check.json and .md
    make gpu-check DRY_RUN=1 OUT=/tmp/out  # everything but CUDA, on the CPU, at small shapes
    python bench/gpu_check.py --out /tmp/out --parts engine_parity,throughput --budget-s 200

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
   FlexAttention, both checked against float64 first: which `auto` should order first;
6. the lease host's own parts (bench/lease_host_parts.py), where it defines them: amx_kernels,
   relay_routers.

`--budget-s`: a part that would start once this many seconds have passed is recorded as not
started. Every part's result is written to gpu_check.json and .md as soon as it ends, so a run
cut off at the lease's limit still leaves what it did; the report names the parts that failed
(or were not reached) and the command that reruns just those.

A dry run shrinks the shapes (the kernels run under Triton's interpreter) and reports the same
fields, so CI checks the script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import shlex
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
# The lease host's own parts, appended last, each where this module (its owners') defines it.
LEASE_HOST_MODULE = "bench.lease_host_parts"
LEASE_HOST_PARTS = ("amx_kernels", "relay_routers")
# Parts start within this, so that the last one started ends inside a device call of 480-540 s
# (docs/benchmarks.md) and a failed part can be rerun in the lease's 15 minutes.
DEFAULT_BUDGET_S = 300.0
# Parts that take a cap (the lease host's: amx_kernels, relay_routers, 240 s each at most) are
# cut to end by this, so that one started just inside the budget still ends inside the call.
DEFAULT_END_S = 480.0
RERUN_FOLDER = "rerun"


def all_parts() -> dict[str, Part]:
    """PARTS, then the lease host's parts that its module defines; where that module exists but
    fails to import, its parts fail with the reason rather than vanish from the report."""
    parts = dict(PARTS)
    try:
        module = importlib.import_module(LEASE_HOST_MODULE)
    except Exception as exc:  # noqa: BLE001 - a broken module fails its parts, not the check
        if isinstance(exc, ModuleNotFoundError) and exc.name == LEASE_HOST_MODULE:
            return parts  # not in this tree: the table alone
        broken = _failing(f"{LEASE_HOST_MODULE} does not import: {type(exc).__name__}: {exc}")
        return parts | dict.fromkeys(LEASE_HOST_PARTS, broken)
    defined = {name: getattr(module, name, None) for name in LEASE_HOST_PARTS}
    return parts | {name: fn for name, fn in defined.items() if callable(fn)}


def _failing(message: str) -> Part:
    def part(device: str) -> dict:
        raise ImportError(message)

    return part


def choose_parts(parts: dict[str, Part], names: str | None) -> dict[str, Part]:
    """The parts `--parts a,b` names, in the table's order; ValueError naming an unknown one."""
    if names is None:
        return dict(parts)
    asked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in asked if n not in parts]
    if unknown or not asked:
        what = f"unknown part {unknown[0]!r}" if unknown else "no part named"
        raise ValueError(f"--parts: {what}; allowed: {', '.join(parts)}")
    return {name: fn for name, fn in parts.items() if name in asked}


def run_part(fn: Part, device: str, left_s: float = math.inf) -> dict:
    """`fn(device)`; a part that takes a `cap_s` (the lease host's) is given at most `left_s`."""
    start = time.perf_counter()
    kwargs = {}
    cap = inspect.signature(fn).parameters.get("cap_s")
    if cap is not None and math.isfinite(left_s):
        kwargs["cap_s"] = max(1.0, min(cap.default, left_s))
    try:
        result = {"ok": True, **fn(device, **kwargs)}
    except PartFailed as exc:
        result = {"ok": False, "error": str(exc), **exc.found}
    except Exception as exc:  # noqa: BLE001 - a failed part is a result; the others still run
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def run_parts(
    parts: dict[str, Part],
    device: str,
    budget_s: float,
    on_result: Callable[[dict[str, dict]], None],
    clock: Callable[[], float] = time.monotonic,
    end_s: float = math.inf,
) -> dict[str, dict]:
    """Each part in order, `on_result(results so far)` after each; a part that would start once
    `budget_s` is spent is recorded as not started, and one that takes a cap is cut to end by
    `end_s` (both counted from the first part's start)."""
    start = clock()
    results: dict[str, dict] = {}
    for name, fn in parts.items():
        spent = clock() - start
        if spent >= budget_s:
            error = f"not started: budget of {budget_s:g} s spent ({spent:.0f} s in)"
            results[name] = {"ok": False, "error": error, "seconds": 0.0}
        else:
            print(f"[gpu-check] {name} ...", flush=True)
            results[name] = run_part(fn, device, end_s - spent)
            outcome = "ok" if results[name]["ok"] else f"FAILED: {results[name]['error'][:300]}"
            print(f"[gpu-check] {name}: {outcome} ({results[name]['seconds']} s)", flush=True)
        on_result(results)
    return results


def unfinished(asked: list[str], results: dict[str, dict]) -> list[str]:
    """The asked parts that failed, were not started or not reached (a run cut off)."""
    return [name for name in asked if not results.get(name, {}).get("ok")]


def _rerun_args(names: list[str], dry_run: bool, budget_s: float) -> list[str]:
    args = ["--parts", ",".join(names), *["--dry-run"] * dry_run]
    return args + (["--budget-s", f"{budget_s:g}"] if budget_s != DEFAULT_BUDGET_S else [])


def rerun_commands(names: list[str], out: Path, dry_run: bool, budget_s: float) -> dict:
    """The commands that run just `names` again: `here`, on this machine as it is, into
    OUT/rerun; `lease`, through bench/gpu_lease.sh, which first installs the carried wheels (a
    lease's machine is bare again once idle for 30 s) and writes into the lease's OUT."""
    args = _rerun_args(names, dry_run, budget_s)
    target = out if out.name == RERUN_FOLDER else out / RERUN_FOLDER
    argv = [sys.executable, os.path.relpath(__file__), "--out", str(target), *args]
    path = os.environ.get("PYTHONPATH")  # the lease's carried wheels (bench/gpu_lease.sh)
    here = (f"PYTHONPATH={shlex.quote(path)} " if path else "") + shlex.join(argv)
    lease = f"GPU_CHECK_ARGS={shlex.quote(shlex.join(args))} bash bench/gpu_lease.sh"
    return {"here": here, "lease": lease}


def main(argv: list[str] | None = None) -> int:
    parts = all_parts()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the JSON and table")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, at small shapes")
    parser.add_argument("--parts", help=f"only these, comma-separated, of: {', '.join(parts)}")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"start no part after this many seconds (default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--end-s",
        type=float,
        default=DEFAULT_END_S,
        help=f"parts that take a cap end by this many seconds (default {DEFAULT_END_S:g})",
    )
    args = parser.parse_args(argv)
    try:
        chosen = choose_parts(parts, args.parts)
    except ValueError as exc:
        parser.error(str(exc))
    if args.budget_s < 0:
        parser.error(f"--budget-s: must be at least 0, got {args.budget_s:g}")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it with --dry-run (make gpu-check DRY_RUN=1)")
    device = "cpu" if args.dry_run else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    asked = list(chosen)
    head = {"host": host_facts(device), "dry_run": args.dry_run, "budget_s": args.budget_s}

    def write(results: dict[str, dict]) -> None:
        left = unfinished(asked, results)
        rerun = rerun_commands(left, args.out, args.dry_run, args.budget_s) if left else {}
        write_report({**head, "asked": asked, "parts": results, "rerun": rerun}, args.out)

    write({})
    results = run_parts(chosen, device, args.budget_s, write, end_s=args.end_s)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    print(f"[gpu-check] wrote {args.out}/gpu_check.json and gpu_check.md")
    for name, result in results.items():
        targets = result.get("targets_met")
        unmet = [t for t, met in targets.items() if not met] if isinstance(targets, dict) else []
        if unmet:
            print(f"[gpu-check] {name}: targets not met: {'; '.join(unmet)}")
    left = unfinished(asked, results)
    if not left:
        print(f"[gpu-check] all {len(asked)} parts ok")
        return 0
    rerun = rerun_commands(left, args.out, args.dry_run, args.budget_s)
    print(f"[gpu-check] failed: {', '.join(left)}")
    print(f"[gpu-check] rerun just those: {rerun['here']}")
    print(f"[gpu-check] or, on a lease: {rerun['lease']}")
    return 1


if __name__ == "__main__":
    if "--dry-run" in sys.argv:
        # Triton's interpreter is chosen when triton is first imported (worker/attention/
        # triton_kernels.py); nothing has imported it yet.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())

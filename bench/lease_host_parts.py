"""Two parts for the lease's check (bench/gpu_check.py's run_part): what the lease's host, 16
cores and AMX where /proc/cpuinfo lists amx_tile, can measure and a 2-core one cannot. Each
returns a dict of findings and raises on failure; `device` "cpu" is the dry run.

- `amx_kernels`: the kernel tests' `amx` parametrizations (the node ids whose parameters name
  the variant, from pytest's collection: `-k amx` would also take the AMX *path* of the other
  variants), which no host had run while `auto` picks that variant on such servers. On a CPU
  without AMX it says so and passes; dry, it only collects and counts them.
- `relay_routers`: bench/relay.py with 1, 2 and 4 routers (simulated workers: no GPU, no Ray),
  router r pinned to core r and everything else off those cores, where the host has cores to
  spare: tokens/s, the routers' CPU per 1000 tokens, and the ratio to one router. Dry, the
  smallest case with 1 and 2 routers.

Either on its own (the lease's sizes; neither part uses the GPU), its findings as JSON:

    python -m bench.lease_host_parts amx_kernels [--dry-run]
    python -m bench.lease_host_parts relay_routers [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from intentserve.worker.kernels import variants

from bench.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]

CPUINFO = Path("/proc/cpuinfo")
KERNEL_TESTS = (
    "tests/worker/model",
    "tests/worker/engine/test_paged_attention_kernels.py",
    "tests/worker/engine/test_cpu_kernels.py",
)
# Not the tests on real models (the lease has none of the model packages) or servers.
KERNEL_TEST_MARKS = "not model and not integration"
AMX_CAP_S = 240.0
RELAY_CAP_S = 240.0
CORES_PER_TEST_WORKER = 4  # xdist workers x their OpenMP threads = the host's cores
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")
_PLURAL = {"error": "errors", "warning": "warnings"}
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The flags of `cpuinfo`'s first `flags` line (none where it has none, or cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def amx_lacks(flags: set[str]) -> list[str]:
    """What a CPU with `flags` lacks to run the amx variant's kernels (variants.py's needs)."""
    amx = variants.VARIANTS.get("amx")
    if amx is None:
        return ["an amx variant (worker/kernels/variants.py lists none)"]
    return [flag for flag in amx.needs if flag not in flags]


def amx_node_ids(collected: str) -> list[str]:
    """The node ids, in `pytest --collect-only -q` output, whose parameters include the amx
    variant: "amx" as one of the id's dash-separated parts, case and all (the AMX path is "AMX",
    x86-64-v3 splits into three parts, none of them "amx")."""
    ids = []
    for line in collected.splitlines():
        node_id = line.strip()
        if "::" in node_id and node_id.endswith("]"):
            params = node_id.rpartition("[")[2][:-1]
            if "amx" in params.split("-"):
                ids.append(node_id)
    return ids


def pytest_summary(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line ("3 failed, 10 passed, 2 skipped in 1.23s",
    decorated or not), by outcome, "error" and "warning" in their plural."""
    for line in reversed(output.strip().splitlines()):
        counts = _COUNT.findall(line)
        if counts and (" in " in line or line.startswith("=")):
            return {_PLURAL.get(name, name): int(n) for n, name in counts}
    return {}


def skip_reasons(output: str) -> dict[str, int]:
    """pytest's `-rs` lines ("SKIPPED [3] file.py:12: reason"), counted by reason."""
    reasons: dict[str, int] = {}
    for line in output.splitlines():
        match = _SKIPPED.match(line)
        if match:
            reasons[match[2]] = reasons.get(match[2], 0) + int(match[1])
    return reasons


def run_capped(command: list[str], timeout_s: float, env: dict | None = None) -> tuple[int, str]:
    """`command`'s exit status and output (stdout and stderr), run from the repository root in a
    session of its own, so that at `timeout_s` it and every process it started are killed, and
    this raises with the output's end."""
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RuntimeError(f"{command[1:4]} ran past {timeout_s:.0f} s:\n{out[-3000:]}") from None
    return proc.returncode, out


def run_checked(command: list[str], timeout_s: float, env: dict | None = None) -> str:
    """run_capped's output; raises on a non-zero exit too, with the output's end."""
    status, out = run_capped(command, timeout_s, env)
    if status != 0:
        raise RuntimeError(f"{command[1:4]} exit {status}:\n{out[-3000:]}")
    return out


def xdist_workers(cores: int) -> int:
    """The amx run's pytest-xdist workers: one per CORES_PER_TEST_WORKER of `cores` (each with as
    many OpenMP threads), 0 (one process) where xdist is not installed or that is one worker."""
    workers = cores // CORES_PER_TEST_WORKER
    return workers if workers > 1 and importlib.util.find_spec("xdist") else 0


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]


def amx_kernels(device: str, cap_s: float = AMX_CAP_S, cpuinfo: Path = CPUINFO) -> dict:
    """The amx variant's kernel tests, within `cap_s` in all (collect, build, run)."""
    lacks = amx_lacks(cpu_flags(cpuinfo))
    if lacks and device != "cpu":
        return {"ran": False, "reason": f"this CPU lacks {', '.join(lacks)}: no amx test can run"}
    start = time.monotonic()
    collect = _pytest("--collect-only", "-m", KERNEL_TEST_MARKS, *KERNEL_TESTS)
    node_ids = amx_node_ids(run_checked(collect, cap_s))
    if not node_ids:
        raise RuntimeError(f"no amx parametrization collected in {', '.join(KERNEL_TESTS)}")
    found: dict = {"selected": len(node_ids), "collect_s": round(time.monotonic() - start, 1)}
    if device == "cpu":
        why = "dry run: the amx tests collected, not run"
        if lacks:
            why += f" (this CPU lacks {', '.join(lacks)})"
        return {"ran": False, "reason": why, **found}
    cores = os.cpu_count() or 1
    workers = xdist_workers(cores)
    env = {**os.environ, variants.VARIANT_ENV: "amx"}
    if workers:
        env["OMP_NUM_THREADS"] = str(cores // workers)
    # The amx libraries compiled once, side by side, before the tests (each xdist worker would).
    built = time.monotonic()
    kernels = [sys.executable, "-m", "intentserve.worker.kernels", "--build"]
    run_checked(kernels, cap_s - (built - start), env)
    found["build_s"] = round(time.monotonic() - built, 1)
    tests = time.monotonic()
    xdist = ["-n", str(workers)] if workers else []
    status, out = run_capped(_pytest("-rfEs", *xdist, *node_ids), cap_s - (tests - start), env)
    counts = pytest_summary(out)
    if status not in (0, 1) or not counts:  # 1: tests failed, counted below
        raise RuntimeError(f"pytest exit {status}:\n{out[-3000:]}")
    found |= {"ran": True, "xdist_workers": workers, "tests_s": round(time.monotonic() - tests, 1)}
    found |= {k: counts.get(k, 0) for k in ("passed", "failed", "skipped", "errors")}
    found["skip_reasons"] = skip_reasons(out)
    if found["failed"] or found["errors"]:
        failures = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
        raise RuntimeError(f"amx kernel tests: {counts}\n" + "\n".join(failures[:40]))
    if not found["passed"]:  # e.g. no C compiler: nothing of the amx build was tried
        raise RuntimeError(f"no amx kernel test passed: {counts}, {found['skip_reasons']}")
    return found


@dataclass(frozen=True)
class RelayCase:
    """What relay_routers runs: bench/relay.py's case and arguments, per router count."""

    case: str  # WORKERS:STREAMS
    rounds: int
    stream_s: float
    step_ms: float
    worker_procs: int
    client_procs: int
    router_counts: tuple[int, ...]

    def offered_tokens_per_s(self) -> float:
        return int(self.case.split(":")[1]) * 1000 / self.step_ms


# The lease's case: 2048 streams offer 102,400 tokens/s, more than two routers at ~30k tokens/s
# a core (docs/scale.md, run 13) carry, so 1, 2 and 4 show how routers add up; a round is 512,000
# tokens (~17 s through one router), 3 a count: ~2 minutes. Dry: 2:8, 1 and 2 routers, seconds.
RELAY_CASES = {
    "cuda": RelayCase("16:2048", 3, 5.0, 20.0, 8, 8, (1, 2, 4)),
    "cpu": RelayCase("2:8", 1, 0.3, 10.0, 1, 2, (1, 2)),
}
SPARE_CORES = 4  # the fewest cores left for the clients and workers before they are kept apart


def pinning(cpus: list[int], num_routers: int) -> tuple[list[int], list[int]]:
    """(the cores routers 0.. are pinned to, the cores everything else is kept on): the first
    `num_routers` of `cpus`, and the rest where it has SPARE_CORES or more; else the rest is
    [], everything anywhere (a small host: the dry run)."""
    others = cpus[num_routers:]
    return cpus[:num_routers], others if len(others) >= SPARE_CORES else []


def relay_routers(device: str, cap_s: float = RELAY_CAP_S) -> dict:
    """bench/relay.py at RELAY_CASES[device] for each router count, within `cap_s` in all."""
    plan = RELAY_CASES[device]
    if shutil.which("taskset") is None:
        raise RuntimeError("taskset (util-linux) is missing: bench/relay.py pins the routers")
    router_cpus, other_cpus = pinning(sorted(os.sched_getaffinity(0)), max(plan.router_counts))
    pin = ["taskset", "-c", ",".join(map(str, other_cpus))] if other_cpus else []
    found: dict = {
        "machine": machine_info(),
        "case": plan.case,
        "rounds": plan.rounds,
        "stream_s": plan.stream_s,
        "offered_tokens_per_s": plan.offered_tokens_per_s(),
        "router_cpus": router_cpus,
        "others_on": other_cpus or "any core",
        "routers": {},
    }
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lease-relay-") as tmp:
        for count in plan.router_counts:
            out = Path(tmp) / f"routers{count}.json"
            command = [
                *pin,
                *(sys.executable, "bench/relay.py", "--case", plan.case, "--no-roofline"),
                *("--rounds", str(plan.rounds), "--seconds", str(plan.stream_s)),
                *("--step-ms", str(plan.step_ms), "--worker-procs", str(plan.worker_procs)),
                *("--client-procs", str(plan.client_procs), "--routers", str(count)),
                *("--relay-cpus", ",".join(map(str, router_cpus[:count])), "--out", str(out)),
            ]
            run_checked(command, cap_s - (time.monotonic() - start))
            runs = json.loads(out.read_text())["cases"][plan.case]
            found["routers"][str(count)] = _router_row(count, runs)
    one = found["routers"][str(plan.router_counts[0])]["median_tokens_per_s"]
    for row in found["routers"].values():
        row["vs_one_router"] = round(row["median_tokens_per_s"] / one, 2)
    return found


def _router_row(count: int, runs: list[dict]) -> dict:
    """One router count's rounds: tokens/s and the routers' CPU per 1000 tokens, by round and
    their medians; raises if a stream failed (the figures would not be the relay's)."""
    failed = sum(run["failed"] for run in runs)
    if failed:
        first = next(run["first_error"] for run in runs if run["failed"])
        raise RuntimeError(f"{count} routers: {failed} streams failed, the first: {first}")
    tokens_per_s = [round(run["tokens_per_s"]) for run in runs]
    cpu_ms = [round(run["cpu_s_per_1k_tokens"] * 1000, 1) for run in runs]
    return {
        "tokens_per_s": tokens_per_s,
        "median_tokens_per_s": statistics.median(tokens_per_s),
        "router_cpu_ms_per_1k_tokens": cpu_ms,
        "median_router_cpu_ms_per_1k_tokens": statistics.median(cpu_ms),
        "load": [round(runs[0]["load_before"][0], 2), round(runs[-1]["load_after"][0], 2)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["amx_kernels", "relay_routers"])
    parser.add_argument("--dry-run", action="store_true", help="the small sizes (device cpu)")
    args = parser.parse_args(argv)
    part = {"amx_kernels": amx_kernels, "relay_routers": relay_routers}[args.part]
    print(json.dumps(part("cpu" if args.dry_run else "cuda"), indent=2))


if __name__ == "__main__":
    main()

"""Relay benchmark: tokens/s that one front-end process forwards from simulated workers to gRPC
clients, and the CPU it spends per 1000 tokens, beside the roofline of no relay at all.

    python bench/relay.py                                   # the default cases, 3 rounds
    python bench/relay.py --case 64:1024 --relays 2         # two relays share the load
    python bench/relay.py --case 16:1024 --routers 2        # two `intentserve router`s
    python bench/relay.py --case 2:8 --seconds 1 --rounds 1 --no-roofline   # a quick check
    python bench/relay.py --case 16:1024 --routers 1 --many   # clients on GenerateMany
    python bench/relay.py --case 4:1024 --front 127.0.0.1:50051 --pid 1234 \
        --registry 127.0.0.1:50052 --deployment d --ca-dir DIR   # a front end started by hand

A case `W:S` is W simulated workers (bench/simworker.py, `--worker-procs` processes hosting
them) and S `Generate` streams from `--client-procs` client processes (bench/relay_client.py),
so neither the workers' nor the clients' CPU counts against the relay; with `--many` each
client process sends its streams on one `GenerateMany` call (the roofline's clients, straight to
a worker, keep a `Generate` call each: a worker does not answer GenerateMany). Every stream asks for
`--seconds` worth of tokens at the workers' pace (a step every `--step-ms`, `--tokens-per-step`
tokens a step): S x 1000 / step-ms tokens/s are offered. Measured from the start of the first
stream to the end of the last: tokens/s received by the clients, and CPU seconds (user and
system, /proc) of the relay per 1000 tokens; `per_core_tokens_per_s` is what that CPU cost
allows one core. By default the bench starts the relay itself: today's controller
(`python -m intentserve.controller.server`, mutual TLS with a fresh CA), relay r pinned
to CPU r of `--relay-cpus` (modulo its length: by default the first relay on CPU 0, a second on
CPU 1). With `--front`, `--pid` and the rest it drives a front end already running (e.g. a
router): its workers register at `--registry` with certificates of the CA in `--ca-dir`
(ca.crt and ca.key), as `<deployment>-<i>`. With `--routers R` the relay is R separate
routers (`intentserve router`, router r pinned as relay r is) in front of one controller and
one set of W workers, each router watching the controller's table and streaming from the
workers itself; the clients are spread over the routers, whose CPU is the one measured (not
the controller's, which relays nothing). The controller and the routers inherit the
environment: `INTENTSERVE_EVENT_LOOP=asyncio` runs their servers on asyncio's loop instead of
uvloop (docs/scale.md, run 9, alternates the two).

The roofline: the same clients straight to one simulated worker process (no relay), at each
case's stream count; `vs_roofline` is the relay's tokens/s over it. Every run records the load
average beside it (this host's cores are shared). Results go to `--out`, by default
~/.cache/intentserve/bench/relay.json (bench/out.py): outside the source tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script

import argparse
import json
import os
import statistics
import tempfile

from bench.machine import describe, machine_info
from bench.out import default_out
from bench.relay_fleet import Front, SimWorkers, drive, start_controller, start_router

DEFAULT_CASES = ("1:32", "8:256", "16:1024", "64:1024", "64:4096")


def _measure(fronts: list[Front], workers: int, streams: int, args) -> dict:
    """One run of `streams` streams over `fronts` (their workers already up)."""
    targets = [(f.address, f.server_name, f.pki.ca_file, None) for f in fronts]
    result = drive(
        targets,
        streams=streams,
        tokens=args.tokens,
        client_procs=args.client_procs,
        pids=[f.pid for f in fronts],
        many=args.many,
    )
    return {"workers": workers, "relays": len(fronts), **result}


def run_case(case: str, args, folder: Path) -> list[dict]:
    num_workers, num_streams = (int(n) for n in case.split(":"))
    if args.routers:
        return run_routers(num_workers, num_streams, args, folder)
    fleets: list[tuple[Front, SimWorkers]] = []
    cpus = args.relay_cpus.split(",")
    try:
        for r in range(args.relays):
            if args.front:
                front = Front.external(args)
            else:
                deployment = f"relay{r}"
                pin = cpus[r % len(cpus)]
                front = start_controller(folder / deployment, deployment, num_workers, pin)
            slots = -(-num_streams // (args.relays * num_workers))  # no stream waits for a slot
            fleets.append((front, SimWorkers(front, num_workers, slots, args)))
        for front, _ in fleets:
            front.wait_serving()
        fronts = [front for front, _ in fleets]
        return [_measure(fronts, num_workers, num_streams, args) for _ in range(args.rounds)]
    finally:
        for front, workers in reversed(fleets):
            workers.stop()
            front.stop()


def run_routers(num_workers: int, num_streams: int, args, folder: Path) -> list[dict]:
    """`args.routers` routers, each on its CPU, in front of one controller and its workers."""
    cpus = args.relay_cpus.split(",")
    controller = start_controller(folder / "routed", "routed", num_workers)  # not measured
    workers, routers = None, []
    try:
        workers = SimWorkers(controller, num_workers, -(-num_streams // num_workers), args)
        controller.wait_serving()
        for r in range(args.routers):
            routers.append(start_router(controller, folder / f"router{r}", cpus[r % len(cpus)]))
        for router in routers:
            router.wait_serving()
        return [_measure(routers, num_workers, num_streams, args) for _ in range(args.rounds)]
    finally:
        for router in routers:
            router.stop()
        if workers is not None:
            workers.stop()
        controller.stop()


def roofline(num_streams: int, args, folder: Path) -> list[dict]:
    """The clients straight to one simulated worker, whose process is the one measured."""
    front = start_controller(folder / "roofline", "roofline", 1)  # not measured: not pinned
    workers = None
    try:
        workers = SimWorkers(front, 1, num_streams, args)
        worker_id, address = workers.addresses[0]
        identity = front.pki.identity("bench-client")
        target = (address, front.pki.server_name(worker_id), front.pki.ca_file, identity)
        return [
            {
                "workers": 1,
                "relays": 0,
                **drive(
                    [target],
                    streams=num_streams,
                    tokens=args.tokens,
                    client_procs=args.client_procs,
                    pids=workers.pids,
                ),
            }
            for _ in range(args.rounds)
        ]
    finally:
        if workers is not None:
            workers.stop()
        front.stop()


def _line(label: str, run: dict, offered: float) -> str:
    line = (
        f"{label}: {run['tokens_per_s']:>9,.0f} tok/s of {offered:,.0f} offered, "
        f"{run['cpu_s_per_1k_tokens'] * 1000:6.1f} ms CPU/1k tokens "
        f"(one core: {run['per_core_tokens_per_s']:>9,.0f} tok/s), "
        f"failed {run['failed']}, load {run['load_before'][0]:.2f}->{run['load_after'][0]:.2f}"
    )
    if "vs_roofline" in run:
        line += f", {run['vs_roofline']:.2f}x roofline"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="WORKERS:STREAMS (repeatable)")
    parser.add_argument("--relays", type=int, default=1, help="relay processes sharing a case")
    parser.add_argument(
        "--routers", type=int, default=0, help="separate routers before one controller (0: none)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="each stream's length")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--tokens-per-step", type=int, default=1)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument(
        "--many",
        action="store_true",
        help="each client process's streams on one GenerateMany call, not a Generate call each",
    )
    parser.add_argument("--worker-procs", type=int, default=2)
    parser.add_argument(
        "--relay-cpus", default="0,1", help="relay r runs on CPU r mod this list's length; '': any"
    )
    parser.add_argument("--no-roofline", action="store_true")
    parser.add_argument("--front", help="a running front end's host:port (with --pid ...)")
    parser.add_argument("--pid", type=int, help="the process of --front whose CPU is measured")
    parser.add_argument("--registry", help="where --front's workers register")
    parser.add_argument("--deployment", help="--front's deployment (names its certificates)")
    parser.add_argument("--ca-dir", help="--front's CA: ca.crt and ca.key")
    parser.add_argument("--out", type=Path, default=default_out("relay.json"))
    args = parser.parse_args()
    if args.front and (
        args.relays != 1 or None in (args.pid, args.registry, args.deployment, args.ca_dir)
    ):
        parser.error("--front needs --pid, --registry, --deployment and --ca-dir, one relay")
    if args.routers and (args.front or args.relays != 1):
        parser.error("--routers starts its own routers: not with --front or --relays")
    args.tokens = max(1, round(args.seconds * 1000 / args.step_ms)) * args.tokens_per_step
    cases = args.case or list(DEFAULT_CASES)
    result = {
        "machine": machine_info(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "cases": {},
        "roofline": {},
    }
    print(describe(result["machine"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        for case in cases:
            num_streams = int(case.split(":")[1])
            offered = num_streams * args.tokens_per_step * 1000 / args.step_ms
            if not args.no_roofline and num_streams not in result["roofline"]:
                runs = roofline(num_streams, args, folder)
                result["roofline"][num_streams] = runs
                for i, run in enumerate(runs):
                    print(_line(f"roofline {num_streams:>5} streams #{i + 1}", run, offered))
            runs = run_case(case, args, folder)
            top = result["roofline"].get(num_streams)
            for i, run in enumerate(runs):
                if top:
                    run["vs_roofline"] = run["tokens_per_s"] / statistics.median(
                        r["tokens_per_s"] for r in top
                    )
                label = f"router x{args.routers}" if args.routers else f"relay x{args.relays}"
                print(_line(f"{label} {case:>8} #{i + 1}", run, offered), flush=True)
            result["cases"][case] = runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out} (load average now {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()

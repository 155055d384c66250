"""Failover benchmark: how long after a worker dies does the controller's health say NOT_SERVING,
where the survivors can no longer meet minReady?

    python bench/failover.py                 # 3 kills per case
    python bench/failover.py --kills 1       # a quick check of the script

Results go to `--out`, by default ~/.cache/intentserve/bench/failover.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

`deploy/local.yaml` (two SmolLM2 workers, minReady 2, the shipped 1 s heartbeat and 5 s timeout;
a 32 MiB KV budget and 512-token model length keep it light) is served by a real controller in
this process and two real worker processes (`intentserve.worker.actor.WorkerActor`). Each kill
is a SIGKILL of one worker, in one of two cases:

- `streaming`: while it streams 4 of 8 generations; its streams break at once.
- `idle`: no request in flight; only the controller's watch stream to it breaks.

The time is from the SIGKILL to the NOT_SERVING that a `grpc.health.v1` Watch client receives.
A new worker process replaces the killed one before the next kill. Before the suspect paths the
only way to notice was the heartbeat timeout: 5 s plus up to one reconcile tick.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client import ControllerClient
from intentserve.controller.launch.manifest import load_manifest
from intentserve.controller.server import ControllerServer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.out import default_out  # noqa: E402

OVERRIDES = {
    "INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY": "32Mi",
    "INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN": "512",
    "INTENTSERVE_SPEC__CONTROLLER__PORT": "0",
}
WORKER_MAIN = (
    "import json, sys, threading\n"
    "from intentserve.worker.actor import WorkerActor\n"
    "WorkerActor(json.loads(sys.argv[1]))\n"
    "threading.Event().wait()\n"
)
NUM_STREAMS = 8
SETTLE_S = 1.0  # from READY to the kill: a worker dies long after it starts serving
READY_TIMEOUT_S = 120.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthWatch:
    """The controller's health as a client sees it: monotonic time of each NOT_SERVING."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._call = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(service="")
        )
        self._changed = threading.Condition()
        self.not_serving_s: list[float] = []
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        try:
            for response in self._call:
                with self._changed:
                    if response.status == NOT_SERVING:
                        self.not_serving_s.append(time.monotonic())
                    self._changed.notify_all()
        except grpc.RpcError:
            pass  # closed

    def first_not_serving_after(self, started_s: float, timeout_s: float) -> float:
        with self._changed:
            self._changed.wait_for(
                lambda: any(t > started_s for t in self.not_serving_s), timeout_s
            )
            return min((t for t in self.not_serving_s if t > started_s), default=float("inf"))

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()


def start_worker(manifest, worker_id: str, controller: str) -> subprocess.Popen:
    config = manifest.worker_config(worker_id, controller, "127.0.0.1")
    return subprocess.Popen(
        [sys.executable, "-c", WORKER_MAIN, json.dumps(config)],
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )


def wait_ready(server, timeout_s: float = READY_TIMEOUT_S) -> None:
    if not server.reconciler.wait_until(lambda v: v.ready and not v.degraded, timeout_s).ready:
        raise SystemExit(f"not ready after {timeout_s} s: {server.verdict().reason}")


def open_streams(address: str, victim: str) -> list[threading.Thread]:
    """NUM_STREAMS long generations; returns once the victim streams some of them."""
    streaming = threading.Semaphore(0)

    def one() -> None:
        with ControllerClient(address) as client:
            try:
                for chunk in client.generate("Once upon a time", max_tokens=200, ignore_eos=True):
                    if chunk["worker_id"] == victim and chunk["num_output_tokens"] == 2:
                        streaming.release()
            except grpc.RpcError:
                pass  # the victim's streams end with UNAVAILABLE

    threads = [threading.Thread(target=one, daemon=True) for _ in range(NUM_STREAMS)]
    for thread in threads:
        thread.start()
    for _ in range(NUM_STREAMS // 2):
        if not streaming.acquire(timeout=60):
            raise SystemExit(f"{victim} did not stream")
    return threads


def reap(proc: subprocess.Popen) -> float:
    """When the killed process is gone: the kernel closes its sockets while it tears it down."""
    proc.wait()
    return time.monotonic()


def kill_once(server, watch, workers, manifest, case: str, victim: str) -> dict:
    time.sleep(SETTLE_S)
    threads = open_streams(server.address, victim) if case == "streaming" else []
    exited_s: list[float] = []
    reaper = threading.Thread(target=lambda: exited_s.append(reap(workers[victim])))
    killed_s = time.monotonic()
    os.kill(workers[victim].pid, signal.SIGKILL)
    reaper.start()
    not_serving_s = watch.first_not_serving_after(killed_s, timeout_s=15)
    reaper.join()
    problem = server.deployment.registry.get(victim).problem
    for thread in threads:
        thread.join(60)
    workers[victim] = start_worker(manifest, victim, server.address)
    wait_ready(server)
    return {
        "case": case,
        "victim": victim,
        "seconds_to_not_serving": not_serving_s - killed_s,
        "seconds_to_exit": exited_s[0] - killed_s,
        "noticed_by": problem.message if problem is not None else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="kills per case")
    parser.add_argument("--out", type=Path, default=default_out("failover.json"))
    args = parser.parse_args(argv)
    os.environ.update(OVERRIDES)  # read by load_manifest, as `up` reads them
    manifest = load_manifest(ROOT / "deploy" / "local.yaml")
    server = ControllerServer(manifest.controller_config()).start()
    watch = HealthWatch(server.address)
    workers = {w: start_worker(manifest, w, server.address) for w in manifest.worker_ids()}
    kills = []
    try:
        wait_ready(server)
        for i in range(args.kills):
            for case in ("streaming", "idle"):
                victim = manifest.worker_ids()[i % 2]
                kills.append(kill_once(server, watch, workers, manifest, case, victim))
                k = kills[-1]
                print(
                    f"{case:9} kill of {victim}: NOT_SERVING after "
                    f"{k['seconds_to_not_serving'] * 1000:6.1f} ms, the process gone after "
                    f"{k['seconds_to_exit'] * 1000:6.1f} ms ({k['noticed_by']})",
                    flush=True,
                )
    finally:
        watch.close()
        for proc in workers.values():
            proc.kill()
            proc.wait()
        server.stop(grace_s=0)
    c = manifest.spec.controller
    summary = {
        case: {
            "median_ms": 1000 * statistics.median(k["seconds_to_not_serving"] for k in rows),
            "max_ms": 1000 * max(k["seconds_to_not_serving"] for k in rows),
            "median_exit_ms": 1000 * statistics.median(k["seconds_to_exit"] for k in rows),
        }
        for case in ("streaming", "idle")
        if (rows := [k for k in kills if k["case"] == case])
    }
    for case, s in summary.items():
        print(
            f"{case:9}: NOT_SERVING after median {s['median_ms']:.1f} ms, max {s['max_ms']:.1f} "
            f"ms; the process gone after median {s['median_exit_ms']:.1f} ms (heartbeat timeout "
            f"{c.heartbeat_timeout_s:g} s)"
        )
    results = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "heartbeat": {"interval_s": c.heartbeat_interval_s, "timeout_s": c.heartbeat_timeout_s},
        "kills": kills,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

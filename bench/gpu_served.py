"""The GPU check's served_over_tls part: the controller in the check's own process, the worker a
process of its own (bench/lease_worker.py, no Ray), mutual TLS between them as a deployment has
it. The worker is READY only once the controller has verified its realized paged cache; then a
request goes through the controller to it over TLS. A second controller asks for
`backend: flash`, which a worker without vllm-flash-attn must refuse by name.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.gpu_parts import ROOT, SCRATCH, PartFailed, available_paged_backends, checkpoint

DEPLOYMENT, WORKER_ID = "gpucheck", "gpucheck-0"
# Start-up of the worker's process to its verdict: imports, load, Triton compiles, graph captures.
SETTLE_TIMEOUT_S = {"cuda": 180.0, "cpu": 120.0}
GENERATE_TOKENS = 4


def served_over_tls(device: str) -> dict:
    from intentserve.controller.launch.pki import DeploymentCa

    _, _, folder = checkpoint("smollm2-135m", device)
    ca = DeploymentCa.create(DEPLOYMENT)
    served = "triton" if device == "cuda" else "torch"
    found = {
        backend: _one_worker(ca, folder, device, backend, serve=backend == served)
        for backend in (served, "flash")
    }
    problems = []
    if found[served]["worker_state"] != "ready":
        problems.append(f"the {served} worker did not become READY")
    elif found[served]["tokens_over_tls"] != GENERATE_TOKENS:
        problems.append(
            f"{found[served]['tokens_over_tls']} tokens over TLS, not {GENERATE_TOKENS}"
        )
    flash_missing = "flash" not in available_paged_backends(device)
    if flash_missing and "vllm" not in found["flash"]["problem"]:
        problems.append("backend flash without vllm-flash-attn was not refused naming it")
    if problems:
        raise PartFailed("; ".join(problems), {"cases": found})
    return {"cases": found}


def _controller_files(ca) -> dict[str, str]:
    """The controller's certificate, key and CA as files (what its settings read)."""
    pki = SCRATCH / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    identity = ca.controller_identity(())
    files = {}
    for part in ("cert", "key", "ca"):
        path = pki / f"controller.{part}"
        path.write_bytes(getattr(identity, f"{part}_pem"))
        files[f"tls_{part}_file"] = str(path)
    return files


def _one_worker(ca, folder: Path, device: str, backend: str, serve: bool) -> dict:
    """A controller asking for `backend`, one worker process against it, and what came of it."""
    from intentserve.controller.server import ControllerServer
    from intentserve.controller.settings import ControllerSettings
    from intentserve.worker.runtime.spec import WorkerSpec

    settings = ControllerSettings(
        host="127.0.0.1",
        port=0,
        deployment=DEPLOYMENT,
        paged_attention="on",
        attention_backend=backend,
        heartbeat_interval_s=0.2,
        reconcile_interval_s=0.1,
        **_controller_files(ca),
    )
    server = ControllerServer(settings.config()).start()
    spec = WorkerSpec(
        worker_id=WORKER_ID,
        controller_address=server.registry_address,
        model=str(folder),
        device=device,
        tls=ca.issue(WORKER_ID).to_dict(),
        deployment=DEPLOYMENT,
    )
    log_path = SCRATCH / f"worker-{backend}.log"
    start = time.perf_counter()
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "lease_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        worker.stdin.write(json.dumps(dataclasses.asdict(spec)) + "\n")
        worker.stdin.flush()
        line = _read_line(worker, SETTLE_TIMEOUT_S[device])
        status = json.loads(line) if line else {"phase": f"exited ({worker.poll()})"}
        record = next(iter(server.deployment.workers()), None)
        row = {
            "phase": status["phase"],
            "seconds": round(time.perf_counter() - start, 2),
            "worker_pid": status.get("pid"),  # not the check's: the worker's own process
            "worker_state": record.state.value if record else "",
            "realized_backend": record.realized.backend.value if record and record.realized else "",
            "problem": record.problem.message if record and record.problem else "",
        }
        if serve and row["worker_state"] == "ready":
            row["tokens_over_tls"] = _generate_over_tls(server.address, ca.cert_pem)
        if not line:
            row["worker_log_tail"] = log_path.read_text()[-2000:]
        return row
    finally:
        _stop(worker)
        server.stop(grace_s=0)


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The process's next line on stdout; "" where it ended first or took over `timeout_s`."""
    with ThreadPoolExecutor(1) as pool:
        line = pool.submit(proc.stdout.readline)
        try:
            return line.result(timeout=timeout_s)
        except TimeoutError:
            proc.kill()  # the read then ends at the pipe's end
            return ""


def _stop(proc: subprocess.Popen) -> None:
    """Its stdin's end is the word to stop; a process that does not is killed."""
    try:
        proc.stdin.close()
        proc.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def _generate_over_tls(address: str, ca_pem: bytes) -> int:
    """Tokens of one greedy request through the controller, its certificate checked by the CA."""
    from intentserve.client.credentials import Credentials
    from intentserve.client.sync import ControllerClient

    credentials = Credentials(deployment=DEPLOYMENT, ca_pem=ca_pem)
    with ControllerClient(address, credentials=credentials) as client:
        chunks = client.generate("hello", max_tokens=GENERATE_TOKENS, ignore_eos=True, timeout_s=60)
        return sum(len(c["token_ids"]) for c in chunks)

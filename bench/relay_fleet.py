"""The processes of the relay benchmark (bench/relay.py): a deployment's CA and certificates,
the relay (the controller's embedded router, or separate `intentserve router` processes in front
of a controller) or a front end started by hand, the simulated workers' processes, and the
client processes whose streams are measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.common.tls import CONTROLLER, ROUTER, server_name
from intentserve.controller.control.state import replica_ids
from intentserve.controller.launch.pki import DeploymentCa

from bench.served import cpu_s, free_port

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 600.0


class Pki:
    """A deployment's CA, and the certificates it issues, as files in `folder`."""

    def __init__(self, folder: Path, ca: DeploymentCa) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ca = ca
        self.ca_file = folder / "ca.crt"
        self.ca_file.write_bytes(ca.cert_pem)

    def identity(self, holder: str) -> Path:
        """A certificate and key for `holder`, as a `TlsIdentity.to_dict` JSON file."""
        path = self.folder / f"{holder}.json"
        path.write_text(json.dumps(self.ca.issue(holder).to_dict()))
        return path

    def server_name(self, holder: str) -> str:
        return server_name(self.ca.deployment, holder)


@dataclass
class Front:
    """Where clients stream from (`address`), the process whose CPU is the relay's (`pid`), and
    where its workers register."""

    address: str
    pid: int
    registry: str
    pki: Pki
    proc: subprocess.Popen | None = None  # None: started by hand, left running
    holder: str = CONTROLLER  # whose certificate it presents: the controller's, or a router's

    @classmethod
    def external(cls, args) -> Front:
        folder = Path(args.ca_dir)
        ca = DeploymentCa.load(args.deployment, folder / "ca.crt", folder / "ca.key")
        pki = Pki(folder / "bench", ca)
        return cls(args.front, args.pid, args.registry, pki)

    @property
    def deployment(self) -> str:
        return self.pki.ca.deployment

    @property
    def server_name(self) -> str:
        return self.pki.server_name(self.holder)

    def wait_serving(self) -> None:
        """Until the front end's `grpc.health.v1` says SERVING (its workers verified)."""
        credentials = grpc.ssl_channel_credentials(self.pki.ca_file.read_bytes())
        options = [("grpc.ssl_target_name_override", self.server_name)]
        deadline = time.monotonic() + READY_TIMEOUT_S
        with grpc.secure_channel(self.address, credentials, options=options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                with contextlib.suppress(grpc.RpcError):
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.address} not SERVING after {READY_TIMEOUT_S} s")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_controller(
    folder: Path, deployment: str, replicas: int, cpus: str | None = None
) -> Front:
    """Today's relay: a controller process with mutual TLS, expecting `replicas` workers,
    pinned to `cpus` (a taskset list) when given."""
    pki = Pki(folder, DeploymentCa.create(deployment))
    tls = pki.ca.controller_identity(())
    (folder / "controller.crt").write_bytes(tls.cert_pem)
    (folder / "controller.key").write_bytes(tls.key_pem)
    port, registry = free_port(), free_port()
    env = {
        **os.environ,
        "INTENTSERVE_DEPLOYMENT": deployment,
        "INTENTSERVE_PORT": str(port),
        "INTENTSERVE_REGISTRY_PORT": str(registry),
        "INTENTSERVE_REPLICAS": str(replicas),
        "INTENTSERVE_PAGED_ATTENTION": "on",
        "INTENTSERVE_TLS_CA_FILE": str(pki.ca_file),
        "INTENTSERVE_TLS_CERT_FILE": str(folder / "controller.crt"),
        "INTENTSERVE_TLS_KEY_FILE": str(folder / "controller.key"),
    }
    proc = _start(
        folder / "controller.log",
        [sys.executable, "-m", "intentserve.controller.server"],
        cpus,
        env,
    )
    return Front(f"127.0.0.1:{port}", proc.pid, f"127.0.0.1:{registry}", pki, proc)


def start_router(controller: Front, folder: Path, cpus: str | None = None) -> Front:
    """A separate router (`intentserve router`) of `controller`'s deployment, with a router
    certificate of its CA, pinned to `cpus` when given; it watches `controller`'s table and
    streams from the workers itself."""
    folder.mkdir(parents=True)
    identity = controller.pki.ca.router_identity()
    (folder / "ca.crt").write_bytes(controller.pki.ca.cert_pem)
    (folder / "router.crt").write_bytes(identity.cert_pem)
    (folder / "router.key").write_bytes(identity.key_pem)
    (folder / "admin-token").write_text("bench\n")  # a router's status is for operators only
    manifest = folder / "router.yaml"
    manifest.write_text(
        "apiVersion: intentserve/v1\nkind: Deployment\n"
        f"metadata: {{name: {controller.deployment}}}\n"
        f"spec: {{security: {{adminTokenFile: {folder / 'admin-token'}}}}}\n"
    )
    port = free_port()
    command = [sys.executable, "-m", "intentserve.controller.cli.main", "router", str(manifest)]
    command += ["--controller", controller.registry, "--tls-dir", str(folder)]
    proc = _start(folder / "router.log", [*command, "--port", str(port)], cpus, dict(os.environ))
    return Front(f"127.0.0.1:{port}", proc.pid, controller.registry, controller.pki, proc, ROUTER)


def _start(log_path: Path, command: list[str], cpus: str | None, env: dict) -> subprocess.Popen:
    """`command` (pinned to `cpus` when given), its output in `log_path`, once it says it is
    listening."""
    pin = ["taskset", "-c", cpus] if cpus else []
    with log_path.open("w") as log:
        proc = subprocess.Popen([*pin, *command], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while " listening on " not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{command[2:4]} did not start:\n{log_path.read_text()}")
        time.sleep(0.1)
    return proc


class SimWorkers:
    """`num_workers` simulated workers of `front`'s deployment, over `args.worker_procs`
    processes; each reports `slots` sequence slots."""

    def __init__(self, front: Front, num_workers: int, slots: int, args) -> None:
        ids = replica_ids(front.deployment, num_workers)
        for worker_id in ids:
            front.pki.identity(worker_id)
        num_procs = min(args.worker_procs, num_workers)
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[tuple[str, str]] = []
        try:
            for i in range(num_procs):
                mine = ids[i::num_procs]
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "bench" / "simworker.py"),
                        f"--registry={front.registry}",
                        f"--deployment={front.deployment}",
                        f"--identities={front.pki.folder}",
                        f"--ids={','.join(mine)}",
                        f"--step-ms={args.step_ms}",
                        f"--tokens-per-step={args.tokens_per_step}",
                        f"--slots={slots}",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                self.procs.append(proc)
                for _ in mine:
                    line = proc.stdout.readline().split()
                    if line[:1] != ["ready"]:
                        raise RuntimeError(f"a simulated worker did not come up: {line}")
                    self.addresses.append((line[1], line[2]))
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
            proc.stdout.close()


def drive(
    targets: list[tuple],
    *,
    streams: int,
    tokens: int,
    client_procs: int,
    pids: list[int],
    many: bool = False,
):
    """`streams` streams of `tokens` tokens from client processes spread over `targets`
    ((address, server name, CA file, identity file or None) each); the CPU of `pids` over the
    time from the clients' start to the last stream's end. `many`: each client process's
    streams on one GenerateMany call (bench/relay_client.py)."""
    num_procs = max(len(targets), min(client_procs, streams))
    clients = []
    try:
        for i in range(num_procs):
            address, name, ca, identity = targets[i % len(targets)]
            config = {
                "target": address,
                "server_name": name,
                "ca": str(ca),
                "streams": streams // num_procs + (i < streams % num_procs),
                "tokens": tokens,
                "many": many,
                **({"identity": str(identity)} if identity is not None else {}),
            }
            clients.append(
                subprocess.Popen(
                    [sys.executable, str(ROOT / "bench" / "relay_client.py"), json.dumps(config)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for client in clients:
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError("a client could not connect")
        load_before, cpu_before = os.getloadavg(), [cpu_s(pid) for pid in pids]
        start = time.perf_counter()
        for client in clients:
            client.stdin.write("go\n")
            client.stdin.flush()
        results = [json.loads(client.communicate(timeout=RUN_TIMEOUT_S)[0]) for client in clients]
        wall_s = time.perf_counter() - start
        cpu = sum(cpu_s(pid) for pid in pids) - sum(cpu_before)
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
    received = sum(r["tokens"] for r in results)
    per_1k = cpu * 1000 / received if received else float("inf")
    return {
        "streams": streams,
        "tokens": received,
        "messages": sum(r["messages"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "first_error": next((r["first_error"] for r in results if "first_error" in r), None),
        "wall_s": wall_s,
        "tokens_per_s": received / wall_s,
        "cpu_s": cpu,
        "cpu_s_per_1k_tokens": per_1k,
        "per_core_tokens_per_s": 1000 / per_1k if per_1k else float("inf"),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }

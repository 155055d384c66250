"""A launched deployment's life under `up` (and `serve`): Ray started, one worker actor per
replica, progress watched until the deployment is READY (or a startup failure, named), the status
table and how clients connect printed, then served until shutdown is requested, supervising the
workers' restart budget meanwhile. The command around it (`up.py`) claims the deployment, starts
the controller and takes everything down after.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING

from intentserve.client import credentials, to_data
from intentserve.common.addresses import is_loopback
from intentserve.controller.cli.admin import EXIT_OK
from intentserve.controller.cli.progress import Progress
from intentserve.controller.cli.render import status_text
from intentserve.controller.cli.supervise import supervise
from intentserve.controller.control.convert import status_to_pb
from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerRecord
from intentserve.controller.control.state import WorkerState
from intentserve.controller.launch.manifest import Manifest
from intentserve.controller.launch.replicas import replicas_of
from intentserve.controller.launch.security import DeploymentSecurity
from intentserve.controller.launch.types import ActorProbe, LaunchError
from intentserve.controller.server import ControllerServer
from intentserve.policy import Verdict

if TYPE_CHECKING:
    from intentserve.controller.launch.launcher import RayLauncher

POLL_S = 0.25
ACTOR_POLL_S = 2.0  # while serving: how often the actors are asked whether they live
WAITING_NOTE_S = 15.0  # while starting: how often a "still waiting" line is printed
_ANY_HOST = ("0.0.0.0", "::", "[::]")


class UpFailed(Exception):
    """`up` cannot go on: the message is printed last, once everything is stopped."""


def _startup_failure(
    verdict: Verdict, workers: tuple[WorkerRecord, ...], probes: dict[str, ActorProbe]
) -> str | None:
    if verdict.failed:
        lines = [f"the policy cannot be realized: {verdict.reason.message}"]
        lines += [
            f"  {w.worker_id}: {w.problem.code.value}: {w.problem.message}"
            for w in workers
            if w.state is WorkerState.REJECTED and w.problem is not None
        ]
        return "\n".join(lines)
    for worker_id, probe in probes.items():
        if (probe.status or {}).get("phase") == "failed":
            return f"worker {worker_id} failed before registering: {probe.status['detail']}"
    return None


def status_report(server: ControllerServer) -> str:
    """The same status table `intentserve status` prints, from the server's own state."""
    deployment = server.deployment
    workers = deployment.workers()
    verdict = deployment.verdict(workers)
    message = status_to_pb(
        deployment.desired, deployment_state(verdict), verdict, workers, deployment.now_s()
    )
    return status_text(to_data(message))


def _controller_address(manifest: Manifest, server: ControllerServer, launcher: RayLauncher):
    """host:port where the workers register with the controller."""
    c = manifest.spec.controller
    if c.advertise_host:
        return f"{c.advertise_host}:{server.registry_port}"
    if launcher.embedded or c.host not in _ANY_HOST:
        if not launcher.embedded and is_loopback(c.host):
            print(
                f"warning: spec.controller.host is {c.host}: workers on other nodes of the "
                "cluster cannot register (use 0.0.0.0)",
                file=sys.stderr,
            )
        return server.registry_address
    return f"{launcher.driver_host()}:{server.registry_port}"


def install_signals(server: ControllerServer, received: list[str]) -> None:
    """SIGINT / SIGTERM ask the controller to shut down; the main loop notices and says so.
    NOTE: the handler only records and sets an event: printing here could re-enter a print."""

    def on_signal(signum, _frame) -> None:
        received.append(signal.Signals(signum).name)
        server.request_shutdown()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)


def bring_up(
    manifest: Manifest,
    server: ControllerServer,
    launcher: RayLauncher,
    progress: Progress,
    prepared: DeploymentSecurity,
    log_format: str,
) -> int:
    """Start Ray and the replicas' actors, wait until the deployment is READY, then serve it.
    Raises `UpFailed` or `LaunchError`, which the caller prints once everything is stopped."""
    s, r = manifest.spec, manifest.spec.resources
    described = launcher.start(s.replicas * r.num_cpus, s.replicas * r.num_gpus)
    install_signals(server, progress.signals)  # NOTE: ray.init installed its own SIGTERM one
    progress.say(f"ray: {described}, GCS at {launcher.gcs_address()}")
    security = manifest.spec.security
    if not launcher.embedded and security.insecure and not security.insecure_network:
        raise LaunchError(
            "spec.security.insecure is true on a joined Ray cluster, where workers listen on "
            "every interface: set spec.security.insecureNetwork: true to accept plaintext there"
        )
    replicas = replicas_of(
        manifest,
        _controller_address(manifest, server, launcher),
        launcher.worker_host(),
        prepared,
        log_format,
    )
    adopted = launcher.launch(replicas)
    kept = f", {len(adopted)} adopted from an earlier `up` ({', '.join(adopted)})" * bool(adopted)
    progress.say(
        f"workers: {len(replicas) - len(adopted)} actors created{kept} (numCpus {r.num_cpus:g}, "
        f"numGpus {r.num_gpus:g}, maxRestarts {manifest.spec.max_restarts})"
    )
    deadline_s = time.monotonic() + manifest.spec.startup_timeout_s
    next_note_s = time.monotonic() + WAITING_NOTE_S
    while True:
        verdict = server.wait_until_settled(POLL_S)
        if server.wait(0):
            raise UpFailed("interrupted before the deployment became ready")
        probes = launcher.probe(POLL_S)
        progress.controller(server, verdict)
        progress.actors(probes)
        if verdict.ready:
            break
        failure = _startup_failure(verdict, server.deployment.workers(), probes) or supervise(
            server.deployment, probes, s.max_restarts
        )
        if failure is not None:
            raise UpFailed(failure)
        if time.monotonic() > deadline_s:
            raise UpFailed(
                f"not ready after spec.startupTimeoutS={manifest.spec.startup_timeout_s:g}"
                f" s: {verdict.reason.code.value}: {verdict.reason.message}"
            )
        if time.monotonic() > next_note_s:
            next_note_s += WAITING_NOTE_S
            progress.say(f"still waiting: {verdict.reason.message}")
    progress.say(f"READY after {progress.elapsed_s:.1f} s")
    print(f"\n{status_report(server)}\n", flush=True)
    if server.http_url:
        print(f"serving HTTP on {server.http_url}: OpenAI's /v1, /health, /metrics", flush=True)
        print(client_hint(server, manifest.spec.model.served(), prepared), flush=True)
    print(
        f"serving gRPC on {server.address} (intentserve.v1.Inference/Generate); "
        f"try: intentserve generate 'Hello' --controller {server.address}\n"
        "Ctrl-C, SIGTERM or `intentserve down` stops it.",
        flush=True,
    )
    return _serve(server, launcher, progress, s.max_restarts)


def _serve(
    server: ControllerServer, launcher: RayLauncher, progress: Progress, max_restarts: int
) -> int:
    """Report every change until shutdown is requested; Ray restarts dead workers meanwhile.
    Exit 1 once workers whose restart budget is spent leave too few to meet minReady."""
    next_actor_poll_s = 0.0
    while not server.wait(1.0):
        failure = None
        try:
            progress.controller(server, server.verdict())
            if time.monotonic() > next_actor_poll_s:
                next_actor_poll_s = time.monotonic() + ACTOR_POLL_S
                probes = launcher.probe(POLL_S)
                progress.actors(probes)
                failure = supervise(server.deployment, probes, max_restarts)
        except Exception as error:  # NOTE: reporting must never stop serving
            progress.say(f"cannot read the status: {type(error).__name__}: {error}")
        if failure is not None:
            progress.controller(server, server.verdict())
            raise UpFailed(failure)
    return EXIT_OK


def client_hint(server: ControllerServer, served_name: str, prepared: DeploymentSecurity) -> str:
    """How an OpenAI client connects: base URL, the model's name and, when `up` made the API
    key, the key (a key read from apiKeysFile stays in its file)."""
    http_url = server.http_url
    lines = [f"OpenAI clients: base_url {http_url}/v1, model {served_name!r}"]
    if prepared.api_key is not None:
        lines.append(f"  API key (made for this run): {prepared.api_key}")
        lines.append(f"  export OPENAI_BASE_URL={http_url}/v1 OPENAI_API_KEY={prepared.api_key}")
    if http_url.startswith("https:"):
        ca_file = credentials.folder_for(server.address) / "ca.crt"
        lines.append(f"  HTTPS: clients verify it with the CA in {ca_file}")
    return "\n".join(lines)

"""What `intentserve up` prints while it starts and serves: each change since the last look,
with the time since `up` started (actors before they register, then the controller's view of each
worker and of the deployment)."""

from __future__ import annotations

import time

from intentserve.client import to_data
from intentserve.controller.cli.render import describe_realized
from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerRecord
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.controller.launch.types import ActorProbe, ActorState
from intentserve.controller.server import ControllerServer
from intentserve.convert import realized_to_pb
from intentserve.policy import Verdict


class Progress:
    """Prints what changed since the last look, with the time since `up` started: actors before
    they register, then the controller's view of each worker and of the deployment (read from
    the server `up` owns, as typed values)."""

    def __init__(self) -> None:
        self.started_s = time.monotonic()
        self._actors: dict[str, tuple] = {}
        self._workers: dict[str, tuple[WorkerState, str]] = {}
        self._deployment: DeploymentState | None = None
        self.signals: list[str] = []  # names of the signals received, in order

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    def say(self, text: str) -> None:
        print(f"[{self.elapsed_s:6.1f}s] {text}", flush=True)

    def actors(self, probes: dict[str, ActorProbe]) -> None:
        for worker_id, probe in probes.items():
            if probe.state is ActorState.STARTING:
                continue  # no answer yet: busy starting, or loading with the GIL held
            phase = (probe.status or {}).get("phase", "")
            key = (probe.state, phase)
            if self._actors.get(worker_id) == key:
                continue
            self._actors[worker_id] = key
            if probe.state is ActorState.RESTARTING:
                self.say(f"{worker_id}: its actor died; Ray is restarting it")
            elif probe.state is ActorState.DEAD:
                self.say(f"{worker_id}: its actor is dead: {probe.error}")
            elif phase == "probing":
                self.say(f"{worker_id}: actor up (pid {probe.status['pid']}), reading the model")
            elif phase == "registering":
                self.say(f"{worker_id}: registering with the controller")
            elif phase == "failed":
                self.say(f"{worker_id}: FAILED - {probe.status['detail']}")

    def controller(self, server: ControllerServer, verdict: Verdict) -> None:
        deployment = server.deployment
        for w in deployment.workers():
            # NOTE: registered turns into loading at once; the two read as one event.
            state = WorkerState.LOADING if w.state is WorkerState.REGISTERED else w.state
            if self._workers.get(w.worker_id) == (state, w.address):
                continue
            self._workers[w.worker_id] = (state, w.address)
            self.say(f"{w.worker_id}: {_worker_event(w)}")
        state = deployment_state(verdict)
        if state is not self._deployment:
            self._deployment = state
            self.say(
                f"deployment {deployment.desired.deployment}: {state.value.upper()} - "
                f"{verdict.reason.code.value}: {verdict.reason.message}"
            )


def _worker_event(w: WorkerRecord) -> str:
    if w.state in (WorkerState.REGISTERED, WorkerState.LOADING):
        return (
            f"registered at {w.address} ({w.capability.device_kind.value}); "
            "loading the model and realizing the KV cache"
        )
    if w.state is WorkerState.READY and w.realized is not None:
        realized = describe_realized(to_data(realized_to_pb(w.realized)))
        note = "".join(
            f"; fallback {r.code.value}: {r.message}" for r in w.realized.fallback_reasons
        )
        return f"READY - {realized}{note}"
    first = w.reasons[0] if w.reasons else None
    why = f"{first.code.value}: {first.message}" if first else ""
    return f"{w.state.value.upper()} - {why}"

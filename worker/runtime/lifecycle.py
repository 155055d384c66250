"""One worker's life: probe -> register -> build the engine the controller resolved -> report what
was realized -> serve, heartbeating from registration on.

    runtime = WorkerRuntime(WorkerSpec("local-0", "127.0.0.1:50051")).start()
    runtime.wait_for(Phase.SERVING, Phase.REJECTED, Phase.FAILED)
    runtime.stop()

A worker the controller refuses, or that cannot honour its policy while loading, ends REJECTED
with the reason (and the controller knows it); one that cannot even register ends FAILED. One
whose realized report is rejected ends REJECTED too, and (as an actor) leaves for a restart.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import grpc
import torch
from intentserve.policy import Capability, PagedAttentionRequiredError, Reason, ReasonCode
from intentserve.worker.cache.kv_pool import KvBudgetError
from intentserve.worker.capability import probe_capability
from intentserve.worker.engine.builder import build_engine
from intentserve.worker.engine.encoder_engine import EncoderEngine, build_encoder_engine
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.grammar import prebuild_vocabulary
from intentserve.worker.engine.kv_setup import KvBudgetTooLargeError
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.model.facts import read_model_facts
from intentserve.worker.model.registry import load_model, load_tokenizer
from intentserve.worker.runtime.heap import settle_heap
from intentserve.worker.runtime.heartbeat import IDLE, Heartbeat
from intentserve.worker.runtime.ports import PortReservation
from intentserve.worker.runtime.registry_client import (
    RETRYABLE,
    Action,
    NotRegistered,
    Registration,
    RegistryClient,
    Rejected,
)
from intentserve.worker.runtime.spec import WorkerSpec
from intentserve.worker.runtime.threads import on_passing_thread
from intentserve.worker.service.server import WorkerServer

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    STARTING = "starting"
    PROBING = "probing"  # reading the model's metadata, measuring the device
    REGISTERING = "registering"
    LOADING = "loading"  # registered: loading the model, realizing the KV cache
    SERVING = "serving"  # verified by the controller
    REJECTED = "rejected"  # the policy cannot be honoured here (the detail says why)
    FAILED = "failed"  # could not register, or lost its resolution (the detail says why)
    STOPPED = "stopped"


FINAL = frozenset({Phase.REJECTED, Phase.FAILED, Phase.STOPPED})
RETRY_S = 1.0


def load_error_reason(error: Exception) -> Reason:
    """What a failed load is reported as (`ReportRealized(load_error=...)`)."""
    if isinstance(error, PagedAttentionRequiredError):
        return Reason(error.reason.code, str(error))
    if isinstance(error, KvBudgetError):
        return Reason(ReasonCode.KV_BUDGET_TOO_SMALL, str(error))
    if isinstance(error, KvBudgetTooLargeError):
        return Reason(ReasonCode.KV_BUDGET_TOO_LARGE, str(error))
    return Reason(ReasonCode.LOAD_FAILED, f"{type(error).__name__}: {error}")


class WorkerRuntime:
    """Runs the lifecycle on a background thread. `on_fatal(reason)` is called when only a fresh
    process can recover (the controller now resolves this worker differently); the Ray actor
    exits there so that Ray restarts it."""

    def __init__(self, spec: WorkerSpec, on_fatal: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._on_fatal = on_fatal
        self._client = RegistryClient(
            spec.controller_address,
            spec.worker_id,
            spec.rpc_timeout_s,
            tls=spec.tls_identity,
            deployment=spec.deployment,
        )
        self._changed = threading.Condition()
        self._phase, self._detail = Phase.STARTING, ""
        self._stop = threading.Event()
        self._register_again = threading.Event()
        self._address = ""
        self._heartbeat: Heartbeat | None = None
        self._server: WorkerServer | None = None
        self._thread = threading.Thread(target=self._run, name=f"runtime-{spec.worker_id}")
        self._thread.daemon = True

    # -- the owner's surface ---------------------------------------------------------------------

    def start(self) -> WorkerRuntime:
        self._thread.start()
        return self

    @property
    def phase(self) -> Phase:
        with self._changed:
            return self._phase

    def status(self) -> dict[str, Any]:
        with self._changed:
            return {
                "worker_id": self.spec.worker_id,
                "phase": self._phase.value,
                "detail": self._detail,
                "address": self._address,
                "pid": os.getpid(),
            }

    def wait_for(self, *phases: Phase, timeout_s: float | None = None) -> Phase:
        with self._changed:
            self._changed.wait_for(lambda: self._phase in phases, timeout_s)
            return self._phase

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        self._register_again.set()  # wakes the serving loop
        if self._thread.is_alive():
            self._thread.join(timeout=grace_s + 30.0)
        self._shut_down(grace_s)
        self._client.close()
        self._set(Phase.STOPPED, self._detail)

    # -- the lifecycle (its own thread) ----------------------------------------------------------

    def _run(self) -> None:
        reservation: PortReservation | None = None
        try:
            if self.spec.num_threads:
                torch.set_num_threads(self.spec.num_threads)
            reservation = PortReservation(self.spec.host)
            self._address = self.spec.address(reservation.port)
            self._set(Phase.PROBING)
            capability = on_passing_thread(self._probe)
            # Before registering: from then on the controller watches this worker's heartbeats,
            # which the vocabulary's build would silence for seconds (grammar.py says why).
            on_passing_thread(self._prebuild_grammar)
            self._set(Phase.REGISTERING)
            registration = self._client.register(
                self._address, capability, self.spec.register_timeout_s
            )
            self._heartbeat = Heartbeat(
                self._client, registration.heartbeat_interval_s, self._load, self._on_action
            ).start()
            self._set(Phase.LOADING, f"loading {self.spec.model}")
            # NOTE: torch work before serving runs on passing threads (`threads` says why).
            engine = on_passing_thread(self._build, registration, capability)
            if engine is None or self._stop.is_set():
                return
            self._server = WorkerServer(
                engine,
                self.spec.worker_id,
                self.spec.model,
                self.spec.host,
                reservation.port,
                capability=capability,
                tls=self.spec.tls_identity,
                deployment=self.spec.deployment,
                stream_interval=self.spec.stream_interval,
            ).start()
            reservation.release()
            reservation = None
            self._serve(registration, capability, engine)
        except Rejected as rejected:
            self._set(Phase.REJECTED, str(rejected.reason))
        except Exception as error:
            log.exception("worker %s failed", self.spec.worker_id)
            detail = f"{type(error).__name__}: {error}"
            self._set(Phase.FAILED, detail)
            if self._heartbeat is not None and self._on_fatal is not None:
                self._on_fatal(detail)  # it had registered: a fresh process may fare better
        finally:
            if reservation is not None:
                reservation.release()
            if self.phase in FINAL or self._stop.is_set():
                self._shut_down(grace_s=0)

    def _serve(
        self, registration: Registration, capability, engine: Engine | EncoderEngine
    ) -> None:
        """Report, then wait; whenever the controller asks, register again and report again."""
        while not self._stop.is_set():
            if self._register_again.is_set():
                self._register_again.clear()
                registration = self._reregister(registration, capability)
                if registration is None:
                    return
            report = self._report(engine)
            try:
                problem = self._client.report_realized(report)
            except NotRegistered as error:
                log.info("worker %s: %s; registering again", self.spec.worker_id, error)
                self._register_again.set()
                continue
            except grpc.RpcError as error:
                if error.code() not in RETRYABLE:
                    raise
                # NOTE: the controller is away; once back, a heartbeat asks us to register.
                log.warning("worker %s: cannot report (%s)", self.spec.worker_id, error.code())
                self._register_again.wait(RETRY_S)
                continue
            if problem is not None:
                log.error("worker %s not verified: %s", self.spec.worker_id, problem)
                self._set(Phase.REJECTED, str(problem))
                if self._on_fatal is not None:
                    # NOTE: a fresh process probes, loads and reports anew; its restart budget
                    # ends a loop of rejections (and `up` fails at once on a policy violation).
                    self._on_fatal(f"its realized report was rejected: {problem}")
                return
            log.info("worker %s verified:\n%s", self.spec.worker_id, report.describe())
            self._set(Phase.SERVING, report.describe().splitlines()[1])
            self._register_again.wait()

    def _report(self, engine: Engine | EncoderEngine) -> RealizedReport:
        """The engine's report with what this worker serves it with (tokens per message)."""
        cache = dataclasses.replace(
            engine.realized.cache, stream_interval=self.spec.stream_interval
        )
        return dataclasses.replace(engine.realized, cache=cache)

    def _probe(self) -> Capability:
        return probe_capability(
            self.spec.device,
            read_model_facts(self.spec.model, self.spec.max_model_len),
            device_map=self.spec.device_map,
            no_kv_cache=self.spec.no_kv_cache,
        )

    def _prebuild_grammar(self) -> None:
        try:
            tokenizer = load_tokenizer(self.spec.model)
        except Exception as error:  # the load after registering reports it as the reason
            log.info(
                "worker %s: no grammar vocabulary built before loading: %s",
                self.spec.worker_id,
                error,
            )
            return
        if tokenizer is not None:
            log.info("worker %s: %s", self.spec.worker_id, prebuild_vocabulary(tokenizer))

    def _build(
        self, registration: Registration, capability: Capability
    ) -> Engine | EncoderEngine | None:
        """The engine the controller resolved (with the capability it was resolved against),
        or None after reporting why it cannot be built (REJECTED)."""
        try:
            loaded = load_model(self.spec.model, self.spec.dtype, self.spec.device)
            config = self.spec.engine_config(
                registration.config,
                registration.kv_budget,
                registration.resolution.weights.intent,
            )
            engine = (
                build_encoder_engine(config.paged, registration.resolution, loaded, self.spec.model)
                if loaded.model is None  # an encoder checkpoint: embeddings, no generation
                else build_engine(config, loaded, capability, registration.resolution)
            )
        except Exception as error:
            reason = load_error_reason(error)
            log.error("worker %s cannot serve: %s", self.spec.worker_id, reason)
            self._client.report_load_error(reason)
            self._set(Phase.REJECTED, str(reason))
            return None
        heap = settle_heap()
        log.info(
            "worker %s: %d objects out of the garbage collector's passes (%.0f ms)",
            self.spec.worker_id,
            heap.frozen_objects,
            heap.seconds * 1e3,
        )
        return engine

    def _reregister(self, registration: Registration, capability) -> Registration | None:
        """Register again (the controller forgot us); the same resolution lets the running
        engine report again, a different one needs a fresh process."""
        log.info("worker %s: the controller asks it to register again", self.spec.worker_id)
        again = self._client.register(self._address, capability, self.spec.register_timeout_s)
        if again.fingerprint == registration.fingerprint:
            return again
        detail = "the controller now resolves this worker differently; a restart rebuilds it"
        self._set(Phase.FAILED, detail)
        if self._on_fatal is not None:
            self._on_fatal(detail)
        return None

    # -- helpers ---------------------------------------------------------------------------------

    def _load(self):
        server = self._server
        return server.loop.load() if server is not None else IDLE

    def _on_action(self, action: Action) -> None:
        if action is Action.REGISTER:
            self._register_again.set()
        elif self._server is not None:
            # DRAIN: NOT_SERVING while the controller routes nothing here; CONTINUE: resumed.
            self._server.set_draining(action is Action.DRAIN)

    def _set(self, phase: Phase, detail: str = "") -> None:
        with self._changed:
            self._phase, self._detail = phase, detail
            self._changed.notify_all()
        log.info("worker %s: %s%s", self.spec.worker_id, phase.value, f" ({detail})" * bool(detail))

    def _shut_down(self, grace_s: float) -> None:
        """Idempotent: heartbeats stop first, so the controller sees the worker go silent."""
        heartbeat, self._heartbeat = self._heartbeat, None
        server, self._server = self._server, None
        if heartbeat is not None:
            heartbeat.stop()
        if server is not None:
            server.stop(grace_s)

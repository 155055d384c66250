"""The heartbeat thread: from registration on (loading included) the worker reports its load every
interval, so the controller never takes a slow load for a dead worker."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
from intentserve.worker.runtime.registry_client import Action, RegistryClient
from intentserve.worker.service.engine_loop import EngineLoad

log = logging.getLogger(__name__)

IDLE = EngineLoad(0, 0, 0, 0)  # before the engine exists
_WARN_EVERY_S = 10.0


class Heartbeat:
    def __init__(
        self,
        client: RegistryClient,
        interval_s: float,
        load: Callable[[], EngineLoad],
        on_action: Callable[[Action], None],
    ) -> None:
        self._client = client
        self._interval_s = interval_s
        self._load = load
        self._on_action = on_action
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{client.worker_id}", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        last_warning_s = 0.0
        last = Action.CONTINUE
        while not self._stop.is_set():
            try:
                action = self._client.heartbeat(self._load(), timeout_s=self._interval_s * 2)
                # Every request to act, and the return to CONTINUE after one (a resumed drain).
                if action is not Action.CONTINUE or last is not Action.CONTINUE:
                    self._on_action(action)
                last = action
            except grpc.RpcError as error:
                # NOTE: the controller may be restarting; it asks us to register when it is back.
                if time.monotonic() - last_warning_s > _WARN_EVERY_S:
                    log.warning("heartbeat failed: %s %s", error.code().name, error.details())
                    last_warning_s = time.monotonic()
            except Exception:  # NOTE: one failure must never stop the heartbeats
                log.exception("heartbeat failed")
            self._stop.wait(self._interval_s)

"""A separate router's watch of the controller's worker table: one thread holds the
`WorkerTable.Watch` stream open, applies each event to the table, ends the streams of workers the
controller says were lost, and opens the stream again (after a short backoff) whenever it breaks.
While it is broken the table goes stale from its last event (watched.py)."""

from __future__ import annotations

import logging
import threading

import grpc
from intentserve.controller.router.convert import table_update_from_pb
from intentserve.controller.router.watched import WatchedTable
from intentserve.policy import Reason, ReasonCode
from intentserve.v1 import admin_pb2, admin_pb2_grpc

log = logging.getLogger(__name__)

RETRY_S = (0.1, 0.2, 0.5, 1.0)  # the waits before each new attempt, the last one repeated


class TableWatch:
    def __init__(
        self,
        channel: grpc.Channel,
        table: WatchedTable,
        router,
        *,
        router_id: str,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """`channel`: to the controller (with TLS, presenting the router's certificate);
        `router`: whose streams to lost workers are ended, and whose queue is woken;
        `metadata`: what each watch call carries (an admin token, where no certificate is)."""
        self._stub = admin_pb2_grpc.WorkerTableStub(channel)
        self._table = table
        self._router = router
        self._router_id = router_id
        self._metadata = metadata
        self._stopped = threading.Event()
        self._call: grpc.Call | None = None
        self._last_failure: str | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="table-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join()

    def _run(self) -> None:
        attempt = 0
        while not self._stopped.is_set():
            heard = self._watch_once()
            attempt = 0 if heard else attempt + 1
            self._stopped.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)])

    def _watch_once(self) -> bool:
        """One watch call, until it breaks; whether it brought any event."""
        request = admin_pb2.WatchWorkersRequest(router_id=self._router_id)
        heard = False
        with self._lock:
            if self._stopped.is_set():
                return False
            self._call = call = self._stub.Watch(request, metadata=self._metadata)
        try:
            for event in call:
                heard = True
                for worker_id in self._table.apply(table_update_from_pb(event)):
                    self._end_streams(worker_id)
                self._router.workers_changed()  # the queue's head may find a slot now
            why = "the controller ended the watch"
        except grpc.RpcError as error:
            why = f"{error.code().name}: {error.details()}"
        if not self._stopped.is_set():
            if heard or why != self._last_failure:  # once per kind of failure, not per retry
                log.warning("no worker table watch on the controller: %s", why)
            self._last_failure = why
            self._table.lost_contact(why)
        return heard

    def _end_streams(self, worker_id: str) -> None:
        reason = Reason(ReasonCode.WORKER_NOT_SERVING, "the controller reports it lost")
        num_streams = self._router.abort_streams(worker_id, reason)
        log.warning("worker %s is lost; ended %d streams", worker_id, num_streams)

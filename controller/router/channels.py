"""A router's channels to the workers' servers, one per address; on each, the multiplexed call
that carries every request to that worker (`worker_mux`), and a watch stream. (The embedded
router's are the controller's too: its reconcile loop watches the workers through them.)

The watch is a `grpc.health.v1.Health/Watch` stream the worker's server holds open (health is
open to any caller). Its statuses do not matter; its life does: when the worker's process dies
or its server stops, the stream breaks with UNAVAILABLE at once, like any stream to it, and the
worker becomes SUSPECT without waiting for the heartbeat timeout. A watch that is answered again
(`connected`) is what lets the reconcile loop restore a suspect worker.

NOTE: a stream, not grpc's connectivity subscription: that one's poller thread races with
`channel.close()` and can fail on the closed channel.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.common.streaming import STREAM_READER_OPTIONS
from intentserve.common.tls import TlsIdentity, secure_aio_channel, secure_channel, server_name
from intentserve.controller.router.table import WorkerTable
from intentserve.controller.router.worker_mux import WorkerMux
from intentserve.policy import Reason, ReasonCode

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 2.0
DRAIN_S = 0.2  # after closing a loop's calls: for their last events (aclose_loop)


class _Entry:
    """One address: its channel and the watch on it."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.mux: WorkerMux | None = None  # the multiplexed call for requests, once opened
        # per event loop: a grpc.aio channel made on it, and the multiplexed call run there
        self.on_loops: dict[asyncio.AbstractEventLoop, tuple[grpc.aio.Channel, WorkerMux]] = {}
        self.watch: grpc.Call | None = None  # the open watch stream, if any
        self.connected = False  # the open watch has been answered
        self.unwatchable = False  # the server has no health service: only streams tell


class WorkerChannels:
    def __init__(
        self,
        table: WorkerTable | None,
        factory: Callable[[str, str], grpc.Channel],
        aio_factory: Callable[[str, str], grpc.aio.Channel] | None = None,
    ) -> None:
        """`table`: told when a watch breaks (None: no watches are opened);
        `factory(address, worker_id)`: with TLS, the worker is verified as itself;
        `aio_factory` the same for an event loop (None: requests on a loop use `factory`'s)."""
        self._table = table
        self._factory = factory
        self._aio_factory = aio_factory
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def get(self, address: str, worker_id: str) -> grpc.Channel:
        """The channel to `worker_id` at `address` (made on first use)."""
        with self._lock:
            return self._entry(address, worker_id).channel

    def mux(
        self, address: str, worker_id: str, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> WorkerMux:
        """The multiplexed call to `worker_id` at `address`; a new one when the last ended.
        With `loop` (the caller runs on it) and an aio factory, the call runs on that loop."""
        with self._lock:
            entry = self._entry(address, worker_id)
            if loop is not None and self._aio_factory is not None:
                channel, mux = entry.on_loops.get(loop, (None, None))
                if mux is None or mux.closed:
                    if channel is not None:
                        # NOTE: a fresh channel after a broken call: the old one may be backing
                        # off its reconnects, while the worker, restored because its watch (on
                        # the sync channel) was answered, takes new connections at once.
                        _close_on(loop, channel)
                    channel = self._aio_factory(address, worker_id)
                    mux = WorkerMux(channel, worker_id, loop=loop)
                    entry.on_loops[loop] = (channel, mux)
                return mux
            if entry.mux is None or entry.mux.closed:
                entry.mux = WorkerMux(entry.channel, worker_id)
            return entry.mux

    def watch(self, workers: dict[str, str]) -> None:
        """Hold a watch stream open to each worker (address -> worker id) that has none."""
        request = health_pb2.HealthCheckRequest(service="")
        with self._lock:
            for address, worker_id in workers.items():
                entry = self._entry(address, worker_id)
                if entry.watch is not None or entry.unwatchable:
                    continue
                entry.watch = health_pb2_grpc.HealthStub(entry.channel).Watch(request)
                threading.Thread(
                    target=self._follow,
                    args=(address, worker_id, entry, entry.watch),
                    name=f"watch-{worker_id}",
                    daemon=True,
                ).start()

    def connected(self, address: str) -> bool:
        """Whether a watch stream to `address` is open and has been answered."""
        with self._lock:
            entry = self._entries.get(address)
            return entry is not None and entry.connected

    def prune(self, keep: set[str]) -> None:
        """End the watch and close the channel of every address not in `keep` (a restarted
        worker moved)."""
        with self._lock:
            stale = [self._entries.pop(a) for a in list(self._entries) if a not in keep]
        for entry in stale:
            if entry.watch is not None:
                entry.watch.cancel()
            if entry.mux is not None:
                entry.mux.close()
            entry.channel.close()
            for loop, (channel, mux) in entry.on_loops.items():
                mux.close()
                _close_on(loop, channel)

    def close(self) -> None:
        self.prune(set())

    async def aclose_loop(self) -> None:
        """Close the channels made on the running loop, and their calls, there: the loop is
        about to end.

        NOTE: grpc's poller hands each event to the loop of its call, from whichever loop reads
        it; one for a call of a loop that has closed raises there (RuntimeError: Event loop is
        closed, with a traceback). A cancelled call's last events come from grpc's core after
        the cancel returns, and nothing can be awaited for them: the loop runs on for
        DRAIN_S to take them itself."""
        loop = asyncio.get_running_loop()
        with self._lock:
            made = [e.on_loops.pop(loop) for e in self._entries.values() if loop in e.on_loops]
        for channel, mux in made:
            await mux.aclose()
            await channel.close()
        if made:
            await asyncio.sleep(DRAIN_S)

    def _entry(self, address: str, worker_id: str) -> _Entry:
        entry = self._entries.get(address)
        if entry is None:
            entry = self._entries[address] = _Entry(self._factory(address, worker_id))
        return entry

    def _follow(self, address: str, worker_id: str, entry: _Entry, call: grpc.Call) -> None:
        """The watch's own thread: connected while answered, SUSPECT when it breaks."""
        try:
            for _ in call:
                with self._lock:
                    entry.connected = True
        except grpc.RpcError as error:
            self._ended(address, worker_id, entry, error.code(), error.details())
        finally:
            with self._lock:
                entry.connected = False
                if entry.watch is call:
                    entry.watch = None  # the next reconcile pass opens another

    def _ended(
        self, address: str, worker_id: str, entry: _Entry, code: grpc.StatusCode, details: str
    ) -> None:
        if code is grpc.StatusCode.UNIMPLEMENTED:
            log.warning("worker %s at %s has no health service to watch", worker_id, address)
            with self._lock:
                entry.unwatchable = True
        elif code is grpc.StatusCode.UNAVAILABLE:
            reason = Reason(
                ReasonCode.WORKER_NOT_SERVING, f"suspect: its connection broke ({details})"
            )
            if self._table.suspect(worker_id, address, reason):
                log.warning("worker %s is %s", worker_id, reason.message)


def _close_on(loop: asyncio.AbstractEventLoop, channel: grpc.aio.Channel) -> None:
    """Close an aio channel on its loop: waited for from another thread (briefly), scheduled
    when this is the loop's own thread; nothing to do once the loop has closed."""
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(channel.close())
        return
    try:
        asyncio.run_coroutine_threadsafe(channel.close(), loop).result(timeout=CLOSE_WAIT_S)
    except (RuntimeError, TimeoutError, concurrent.futures.TimeoutError):
        log.debug("a channel's close did not finish on its loop (stopped or busy)")


# NOTE: each worker channel has its own subchannels. With gRPC's process-wide pool, a new
# channel to an address an earlier channel had seen fail (a worker restarted on the same port)
# shared that connection's reconnect backoff and failed UNAVAILABLE until it ran out
# (tests/controller/test_worker_channels.py).
WORKER_CHANNEL_OPTIONS = (*STREAM_READER_OPTIONS, ("grpc.use_local_subchannel_pool", 1))


def worker_channels(tls: TlsIdentity | None, deployment: str) -> Callable[[str, str], grpc.Channel]:
    """Channels to the workers: with TLS, the worker is verified as itself and the caller
    presents its own certificate (`controller` or `router`: worker servers accept no one else)."""
    return _channel_factory(tls, deployment, grpc.insecure_channel, secure_channel)


def worker_aio_channels(
    tls: TlsIdentity | None, deployment: str
) -> Callable[[str, str], grpc.aio.Channel]:
    """`worker_channels` for an event loop, where the workers' multiplexed calls of the
    requests served there run (worker_mux.py): the same credentials and options."""
    return _channel_factory(tls, deployment, grpc.aio.insecure_channel, secure_aio_channel)


def _channel_factory(
    tls: TlsIdentity | None, deployment: str, insecure, secure
) -> Callable[[str, str], object]:
    if tls is None:
        return lambda address, worker_id: insecure(address, options=WORKER_CHANNEL_OPTIONS)
    return lambda address, worker_id: secure(
        address, tls, server_name(deployment, worker_id), options=WORKER_CHANNEL_OPTIONS
    )

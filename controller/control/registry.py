"""Observed state: one record per worker and the transitions between its states.

Records are frozen values replaced under one lock, so a snapshot handed out can never change
under its reader. The registry stores what was decided; `intentserve.controller.control.deployment`
decides it.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from intentserve.controller.control.state import HeartbeatAction, WorkerState
from intentserve.controller.errors import (
    NotThisRegistration,
    UnknownWorker,
    WorkerAlive,
    WrongState,
)
from intentserve.policy import Capability, RealizedCache, Reason, ReasonCode, Resolution

# NOTE: a worker in any of these states has a live process behind it that must heartbeat.
_MONITORED = frozenset(
    {
        WorkerState.REGISTERED,
        WorkerState.LOADING,
        WorkerState.READY,
        WorkerState.DRAINING,
        WorkerState.SUSPECT,
    }
)
# States in which a realized report is verified (a READY worker may report again: drift).
_VERIFIABLE = frozenset({WorkerState.LOADING, WorkerState.READY, WorkerState.DRAINING})
_RESOLVABLE = frozenset({WorkerState.REGISTERED})
_DRAINABLE = frozenset({WorkerState.REGISTERED, WorkerState.LOADING, WorkerState.READY})


@dataclass(frozen=True)
class WorkerLoad:
    """Load of one worker, from its last heartbeat."""

    num_running: int = 0
    num_waiting: int = 0
    num_kv_used: int = 0
    num_kv_total: int = 0
    num_preemptions: int = 0  # cumulative since the worker started, like the prefix-cache counts
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_steps: int = 0  # cumulative: engine steps, their total time, the sequences they advanced
    total_step_s: float = 0.0
    num_step_seqs: int = 0


@dataclass(frozen=True)
class WorkerRecord:
    worker_id: str
    address: str  # host:port of its Inference server
    state: WorkerState
    capability: Capability
    last_seen_s: float  # clock time of the last register, report or heartbeat
    resolution: Resolution | None = None  # None until resolved
    realized: RealizedCache | None = None  # None until it reports
    problem: Reason | None = None  # why it is REJECTED or LOST
    load: WorkerLoad = field(default_factory=WorkerLoad)
    num_outstanding: int = 0  # requests in flight through the controller (n choices count n)
    num_registrations: int = 1  # a restarted worker registers again with the same id
    suspect_since_s: float = 0.0  # clock time it last became SUSPECT
    # NOTE: the secret its registration was answered with; a report or heartbeat speaks for this
    # record only with it (no other process can, even one holding the same certificate).
    registration_token: bytes = b""

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """Why it is not serving, then every fallback it took (no duplicates)."""
        status = {
            WorkerState.REGISTERED: Reason(ReasonCode.WORKER_PENDING, "registered, not resolved"),
            WorkerState.LOADING: Reason(
                ReasonCode.WORKER_PENDING, "loading; has not reported a realized cache yet"
            ),
            WorkerState.DRAINING: Reason(
                ReasonCode.WORKER_NOT_SERVING, "draining: receives no new requests"
            ),
        }.get(self.state, self.problem)
        fallbacks = (self.resolution.fallback_reasons if self.resolution else ()) + (
            self.realized.fallback_reasons if self.realized else ()
        )
        ordered = ((status,) if status is not None else ()) + fallbacks
        return tuple(dict.fromkeys(ordered))


class Registry:
    """Thread-safe store of worker records; `on_change` runs after every state transition."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, WorkerRecord] = {}
        self._on_change = on_change

    def snapshot(self) -> tuple[WorkerRecord, ...]:
        with self._lock:
            return tuple(self._records[k] for k in sorted(self._records))

    def get(self, worker_id: str) -> WorkerRecord:
        with self._lock:
            return self._get(worker_id)

    def register(
        self,
        worker_id: str,
        address: str,
        capability: Capability,
        now_s: float,
        *,
        token: bytes,
        alive_timeout_s: float,
        proof: bytes = b"",
    ) -> WorkerRecord:
        """A fresh record in REGISTERED; a known worker starts again from scratch once it is
        gone, or at once when `proof` is its live registration's token (its own process,
        registering again). WorkerAlive while it is alive to anyone else: monitored, not
        suspect, and heard from within `alive_timeout_s` (a restarted process retries until its
        predecessor lapses)."""
        with self._lock:
            old = self._records.get(worker_id)
            own = old is not None and bool(proof) and _holds(old, proof)
            if old is not None and not own and _alive(old, now_s, alive_timeout_s):
                raise WorkerAlive(
                    f"worker {worker_id!r} is alive ({old.state.value} at {old.address}, heard "
                    f"from {now_s - old.last_seen_s:.1f} s ago): a registration under its id is "
                    f"refused until it is lost (no heartbeat for {alive_timeout_s:g} s) or its "
                    "connection breaks"
                )
            record = WorkerRecord(
                worker_id,
                address,
                WorkerState.REGISTERED,
                capability,
                now_s,
                num_outstanding=old.num_outstanding if old else 0,
                num_registrations=old.num_registrations + 1 if old else 1,
                registration_token=token,
            )
            self._records[worker_id] = record
        self._on_change()
        return record

    def resolve(self, worker_id: str, resolution: Resolution) -> WorkerRecord:
        """REGISTERED -> LOADING, or REJECTED with the resolution's reason."""
        rejection = resolution.rejection
        state = WorkerState.LOADING if rejection is None else WorkerState.REJECTED
        return self._transition(
            worker_id, _RESOLVABLE, state, resolution=resolution, problem=rejection
        )

    def realized(
        self,
        worker_id: str,
        token: bytes,
        realized: RealizedCache | None,
        problem: Reason | None,
        now_s: float,
    ) -> WorkerRecord:
        """A verified report: READY (a DRAINING worker stays DRAINING); a problem: REJECTED."""
        with self._lock:
            old = self._get(worker_id)
            check_token(old, token)
            if old.state not in _VERIFIABLE:
                raise WrongState(_state_error(old, "report a realized state"))
            if problem is not None:
                state = WorkerState.REJECTED
            elif old.state is WorkerState.DRAINING:
                state = WorkerState.DRAINING
            else:
                state = WorkerState.READY
            record = replace(
                old, state=state, realized=realized, problem=problem, last_seen_s=now_s
            )
            self._records[worker_id] = record
        self._on_change()
        return record

    def heartbeat(
        self, worker_id: str, token: bytes, load: WorkerLoad, now_s: float
    ) -> HeartbeatAction:
        """REGISTER when unknown or lost; NotThisRegistration (nothing recorded) with a token
        of another registration."""
        with self._lock:
            old = self._records.get(worker_id)
            if old is None or old.state is WorkerState.LOST:
                return HeartbeatAction.REGISTER
            check_token(old, token)
            self._records[worker_id] = replace(old, load=load, last_seen_s=now_s)
        if old.state is WorkerState.DRAINING:
            return HeartbeatAction.DRAIN
        return HeartbeatAction.CONTINUE

    def drain(self, worker_id: str) -> WorkerRecord:
        """Stop routing to a worker; a rejected or lost one receives nothing already."""
        try:
            return self._transition(worker_id, _DRAINABLE, WorkerState.DRAINING)
        except WrongState:
            return self.get(worker_id)

    def resume(self, worker_id: str) -> WorkerRecord:
        """Undo a drain: back to where it was, its verified state kept (READY is left as is)."""
        with self._lock:
            old = self._get(worker_id)
            if old.state is WorkerState.READY:
                return old
            if old.state is not WorkerState.DRAINING:
                raise WrongState(_state_error(old, "be resumed"))
            if old.realized is not None:
                state = WorkerState.READY
            else:
                state = WorkerState.LOADING if old.resolution else WorkerState.REGISTERED
            record = self._records[worker_id] = replace(old, state=state)
        self._on_change()
        return record

    def suspect(
        self, worker_id: str, address: str, reason: Reason, now_s: float
    ) -> WorkerRecord | None:
        """READY -> SUSPECT; None when the worker is not READY at `address` (the news is about
        an earlier incarnation, or the worker is out of service already)."""
        with self._lock:
            old = self._records.get(worker_id)
            if old is None or old.state is not WorkerState.READY or old.address != address:
                return None
            record = replace(old, state=WorkerState.SUSPECT, problem=reason, suspect_since_s=now_s)
            self._records[worker_id] = record
        self._on_change()
        return record

    def restore(self, worker_id: str) -> bool:
        """SUSPECT -> READY when it has heartbeat since it became suspect; False otherwise."""
        with self._lock:
            old = self._records.get(worker_id)
            if old is None or old.state is not WorkerState.SUSPECT:
                return False
            if old.last_seen_s <= old.suspect_since_s:
                return False
            self._records[worker_id] = replace(old, state=WorkerState.READY, problem=None)
        self._on_change()
        return True

    def lose(self, worker_id: str, reason: Reason) -> WorkerRecord:
        """LOST with `reason`, whatever its state: its process is gone for good."""
        with self._lock:
            old = self._get(worker_id)
            if (old.state, old.problem) == (WorkerState.LOST, reason):
                return old
            record = replace(old, state=WorkerState.LOST, problem=reason)
            self._records[worker_id] = record
        self._on_change()
        return record

    def mark_lost(self, now_s: float, timeout_s: float) -> tuple[WorkerRecord, ...]:
        """Every monitored worker silent for longer than `timeout_s` becomes LOST."""
        lost = []
        with self._lock:
            for worker_id, old in self._records.items():
                silent_s = now_s - old.last_seen_s
                if old.state in _MONITORED and silent_s > timeout_s:
                    problem = Reason(
                        ReasonCode.WORKER_NOT_SERVING,
                        f"lost: no heartbeat for {silent_s:.1f} s (timeout {timeout_s:g} s)",
                    )
                    self._records[worker_id] = replace(old, state=WorkerState.LOST, problem=problem)
                    lost.append(self._records[worker_id])
        if lost:
            self._on_change()
        return tuple(lost)

    def try_acquire(self, worker_id: str, max_outstanding: int, num: int = 1) -> bool:
        """Count `num` more slots (a request's choices) on a READY worker that stays within its
        limit; False otherwise."""
        with self._lock:
            old = self._records.get(worker_id)
            if old is None or old.state is not WorkerState.READY:
                return False
            if old.num_outstanding + num > max_outstanding:
                return False
            self._records[worker_id] = replace(old, num_outstanding=old.num_outstanding + num)
            return True

    def release(self, worker_id: str, num: int = 1) -> None:
        with self._lock:
            old = self._records.get(worker_id)
            if old is not None:
                count = max(old.num_outstanding - num, 0)
                self._records[worker_id] = replace(old, num_outstanding=count)

    def _get(self, worker_id: str) -> WorkerRecord:
        try:
            return self._records[worker_id]
        except KeyError:
            raise UnknownWorker(worker_id) from None

    def _transition(
        self, worker_id: str, allowed: frozenset[WorkerState], to: WorkerState, **changes
    ) -> WorkerRecord:
        with self._lock:
            old = self._get(worker_id)
            if old.state not in allowed:
                raise WrongState(_state_error(old, f"become {to.value}"))
            record = replace(old, state=to, **changes)
            self._records[worker_id] = record
        self._on_change()
        return record


def _alive(record: WorkerRecord, now_s: float, timeout_s: float) -> bool:
    """Whether a live process stands behind the record. A suspect one not heard from since is
    not counted: its connection broke, as a dead process's does, and its replacement must not
    wait; one that has heartbeat since is alive (a dead process cannot)."""
    if record.state not in _MONITORED:
        return False
    if record.state is WorkerState.SUSPECT and record.last_seen_s <= record.suspect_since_s:
        return False
    return now_s - record.last_seen_s <= timeout_s


def _holds(record: WorkerRecord, token: bytes) -> bool:
    return hmac.compare_digest(record.registration_token, token)


def check_token(record: WorkerRecord, token: bytes) -> None:
    """NotThisRegistration unless `token` is the record's registration token."""
    if not _holds(record, token):
        raise NotThisRegistration(
            f"worker {record.worker_id!r}: the registration token is not that of its current "
            "registration (register again)"
        )


def _state_error(record: WorkerRecord, action: str) -> str:
    hint = " (register again)" if record.state is WorkerState.LOST else ""
    return f"worker {record.worker_id!r} is {record.state.value} and cannot {action}{hint}"

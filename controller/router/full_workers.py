"""Workers that refused a request as full. A worker's own admission (its sequence slots and its
queue, RESOURCE_EXHAUSTED past them) counts every router's requests, where each router counts
only its own: with N routers a worker can be sent N times what one router would send it. Its
refusal is therefore not the client's failure: this router sends that worker nothing new for
FULL_BACKOFF_S, or until one of its own requests on it ends (a slot freed), and the refused
request waits at the head of the admission queue meanwhile, under its deadline and the queue's
longest wait, to be sent again when a worker has room.

    full = FullWorkers()
    delay_s = full.mark("w0")     # refused: skip it, and try again after delay_s
    full.is_full("w0")            # True until then
    full.clear("w0")              # one of this router's requests on it ended
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FULL_BACKOFF_S = 0.05  # about an engine step: a worker's slot frees at a step's end


class FullWorkers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until_s: dict[str, float] = {}  # worker id -> when to try it again

    def mark(self, worker_id: str) -> float:
        """The worker refused a request as full; the seconds until it is tried again."""
        with self._lock:
            self._until_s[worker_id] = self._clock() + FULL_BACKOFF_S
        return FULL_BACKOFF_S

    def is_full(self, worker_id: str) -> bool:
        with self._lock:
            until_s = self._until_s.get(worker_id)
            if until_s is None:
                return False
            if self._clock() < until_s:
                return True
            del self._until_s[worker_id]
            return False

    def clear(self, worker_id: str) -> None:
        with self._lock:
            self._until_s.pop(worker_id, None)

"""Torch work done once, before serving, on a thread that ends when it is done.

NOTE: OpenMP (torch's intra-op threads) keeps a team of threads for every thread that ran a
parallel op, for as long as that thread lives. With more such threads in the process than
cores, libgomp stops spin-waiting between parallel regions (a few hundred spins instead of
about 3 ms) and its threads sleep and wake around every op. A worker whose long-lived lifecycle
thread loaded the model therefore stepped its engine in another regime than the same engine in
a process of its own: on an otherwise idle machine its cores idled between ops. Loading and
probing on a thread that ends leaves the engine loop's team the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[..., T], *args: Any, name: str = "passing") -> T:
    """`fn(*args)` on a new thread, joined before returning its result (or raising its error)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn(*args)
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]

"""What a scheduler reports to the engine's metrics."""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.worker.cache.kv_usage import KVUsage


@dataclass(frozen=True)
class SchedulerStats:
    num_waiting: int
    num_running: int
    num_preemptions: int  # cumulative
    kv: KVUsage

"""The deployment's state as Prometheus metrics, read from the registry's snapshot at scrape time
(nothing is pushed): readiness, every worker's realized state as an info metric, its load from
heartbeats (KV cache usage, engine step time and batch size), and the reconcile loop's timings.
Request metrics (`RequestMetrics`) sit beside these in the same `CollectorRegistry`.

The info metric carries the intent (`mode`, `required`) beside what was realized (`enabled`: a
paged KV cache really built, `cache_kind`, `backend`, ...), so "realized != intent" is one line:

    intentserve_worker_realized_info{mode="on",enabled="false"}
      or intentserve_worker_realized_info{mode="off",enabled="true"}

A label is empty where the worker has not realized anything yet (or was rejected before it could).
"""

from __future__ import annotations

from collections.abc import Iterator

from intentserve.controller.control.deployment import Deployment
from intentserve.controller.control.reconcile import Reconciler
from intentserve.controller.control.registry import WorkerRecord
from intentserve.policy import CacheKind, mode_of
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

WORKER = ("deployment", "worker_id")
REALIZED = (
    "state",
    "device",
    "mode",
    "required",
    "enabled",
    "cache_kind",
    "backend",
    "block_size",
    "kv_cache_dtype",
    "scheduler",
    "prefix_caching",
    "weight_format",
    "attention_kernel",
    "kernel_variant",
    "task",
    "reasoning",
    "reason_code",
)
DEPLOYMENT_GAUGES = {
    "ready": "1 when the deployment is READY (gRPC health says SERVING), else 0",
    "failed": "1 when a worker cannot honour a required (or off) policy, else 0",
    "verified_replicas": "Replicas whose realized state is verified",
    "min_ready_replicas": "Verified replicas needed for READY (spec.minReady)",
    "replicas": "Worker replicas the manifest asks for",
}
WORKER_GAUGES = {
    "worker_kv_blocks_used": "KV cache blocks (or slots) in use, from the last heartbeat",
    "worker_kv_blocks_total": "KV cache blocks (or slots) in total, from the last heartbeat",
    "kv_cache_usage_ratio": "Share of the KV cache in use, 0 to 1 (vLLM's kv_cache_usage_perc)",
    "num_requests_running": "Sequences the worker is generating",
    "num_requests_waiting": "Sequences waiting for admission on the worker",
    "worker_requests_outstanding": "Requests in flight to the worker through the router",
    "worker_heartbeat_age_seconds": "Seconds since the worker was last heard from",
    "worker_weight_bytes": "Bytes of weights the worker holds resident (its realized report)",
}
# From the workers' cumulative step counts: rate(_sum) / rate(_count) is the mean over a window.
WORKER_SUMMARIES = {
    "worker_step_duration_seconds": "Engine steps and the time they took",
    "worker_batch_size": "Engine steps and the sequences each advanced (its batch)",
}
WORKER_COUNTERS = {
    "num_preemptions": "Sequences preempted (to be recomputed) since the worker started",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache",
    "prefix_cache_hits": "Prompt tokens whose KV the prefix cache supplied",
    "worker_registrations": "Times the worker registered: 1, plus one per restart (or return)",
}


def _word(value: bool) -> str:
    return "true" if value else "false"


class DeploymentCollector(Collector):
    def __init__(
        self, deployment: Deployment, reconciler: Reconciler, max_restarts: int | None = None
    ) -> None:
        """`max_restarts`: each worker's restart budget (spec.maxRestarts; -1 unlimited), shown
        beside the registrations; None: not known (a controller run without `up`)."""
        self._deployment = deployment
        self._reconciler = reconciler
        self._max_restarts = max_restarts

    def collect(self) -> Iterator[Metric]:
        name = self._deployment.desired.deployment
        yield from self._readiness(name)
        yield from self._workers(name, self._deployment.workers(), self._deployment.now_s())
        yield from self._loop()

    def _readiness(self, name: str) -> Iterator[Metric]:
        desired, verdict = self._deployment.desired, self._reconciler.verdict
        values = {
            "ready": verdict.ready,
            "failed": verdict.failed,
            "verified_replicas": verdict.num_verified,
            "min_ready_replicas": desired.min_ready,
            "replicas": desired.replicas,
        }
        for metric, doc in DEPLOYMENT_GAUGES.items():
            gauge = GaugeMetricFamily(
                f"intentserve_deployment_{metric}", doc, labels=["deployment"]
            )
            gauge.add_metric([name], float(values[metric]))
            yield gauge
        if self._max_restarts is not None:
            budget = GaugeMetricFamily(
                "intentserve_deployment_max_restarts",
                "Each worker's restart budget (spec.maxRestarts; -1: unlimited)",
                labels=["deployment"],
            )
            budget.add_metric([name], float(self._max_restarts))
            yield budget

    def _workers(
        self, name: str, workers: tuple[WorkerRecord, ...], now_s: float
    ) -> Iterator[Metric]:
        info = InfoMetricFamily(
            "intentserve_worker_realized",
            "What each worker realized, beside the intent (mode, required); one per worker",
            labels=WORKER,
        )
        families: dict[str, Metric] = {
            m: GaugeMetricFamily(f"intentserve_{m}", doc, labels=WORKER)
            for m, doc in WORKER_GAUGES.items()
        }
        families.update(
            (m, CounterMetricFamily(f"intentserve_{m}", doc, labels=WORKER))
            for m, doc in WORKER_COUNTERS.items()
        )
        summaries = {
            m: SummaryMetricFamily(f"intentserve_{m}", doc, labels=WORKER)
            for m, doc in WORKER_SUMMARIES.items()
        }
        for w in workers:
            labels = [name, w.worker_id]
            info.add_metric(labels, realized_labels(self._deployment.desired.policy, w))
            load = w.load
            values = {
                "worker_kv_blocks_used": load.num_kv_used,
                "worker_kv_blocks_total": load.num_kv_total,
                "kv_cache_usage_ratio": load.num_kv_used / max(load.num_kv_total, 1),
                "num_requests_running": load.num_running,
                "num_requests_waiting": load.num_waiting,
                "worker_requests_outstanding": w.num_outstanding,
                "worker_heartbeat_age_seconds": max(now_s - w.last_seen_s, 0.0),
                "worker_weight_bytes": w.realized.weight_bytes if w.realized else 0,
                "num_preemptions": load.num_preemptions,
                "prefix_cache_queries": load.num_prefix_queried_tokens,
                "prefix_cache_hits": load.num_prefix_hit_tokens,
                "worker_registrations": w.num_registrations,
            }
            for metric, family in families.items():
                family.add_metric(labels, float(values[metric]))
            steps = summaries["worker_step_duration_seconds"]
            steps.add_metric(labels, load.num_steps, load.total_step_s)
            batch = summaries["worker_batch_size"]
            batch.add_metric(labels, load.num_steps, float(load.num_step_seqs))
        yield info
        yield from families.values()
        yield from summaries.values()

    def _loop(self) -> Iterator[Metric]:
        m = self._reconciler.metrics
        duration = SummaryMetricFamily(
            "intentserve_reconcile_loop_duration_seconds",
            "Time one reconcile pass takes",
            count_value=m.num_ticks,
            sum_value=m.total_tick_s,
        )
        last = GaugeMetricFamily(
            "intentserve_reconcile_loop_last_duration_seconds", "The latest pass", m.last_tick_s
        )
        longest = GaugeMetricFamily(
            "intentserve_reconcile_loop_max_duration_seconds", "The longest pass", m.max_tick_s
        )
        failures = CounterMetricFamily(
            "intentserve_reconcile_phase_failures",
            "Reconcile phases that raised (logged; the loop goes on)",
            labels=["phase"],
        )
        for phase, count in sorted(m.num_failures.items()):
            failures.add_metric([phase], float(count))
        yield from (duration, last, longest, failures)


def realized_labels(policy, w: WorkerRecord) -> dict[str, str]:
    """What `w` realized, beside the intent; empty where it has realized nothing yet."""
    r = w.realized
    return dict(
        zip(
            REALIZED,
            (
                w.state.value,
                w.capability.device_kind.value,
                mode_of(policy).value,
                _word(policy is not None and policy.required),
                _word(r is not None and r.kind is CacheKind.PAGED),
                r.kind.value if r else "",
                r.backend.value if r else "",
                str(r.block_size) if r else "",
                r.kv_cache_dtype if r else "",
                r.scheduler.value if r and r.scheduler else "",
                _word(r.prefix_caching) if r else "",
                r.weight_format.value if r else "",
                r.attention_kernel if r else "",
                r.kernel_variant if r else "",
                r.task if r else "",
                _word(r.reasoning is not None) if r else "",
                w.reasons[0].code.value if w.reasons else "",
            ),
            strict=True,
        )
    )

"""A separate router's worker table as Prometheus metrics, read at scrape time: its freshness
(one series per state, 1 for the current one), how long the controller has been silent, the
revision it routes by, and the bound on serving a stale table.

    intentserve_router_table_freshness{freshness="stale"} == 1   # serving a stale table
"""

from __future__ import annotations

from collections.abc import Iterator

from intentserve.controller.router.watched import Freshness, WatchedTable
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class TableCollector(Collector):
    def __init__(self, table: WatchedTable, deployment: str) -> None:
        self._table = table
        self._deployment = deployment

    def collect(self) -> Iterator[Metric]:
        status = self._table.status()
        labels = [self._deployment]
        freshness = GaugeMetricFamily(
            "intentserve_router_table_freshness",
            "1 for the router's worker table's freshness now (fresh, stale: the controller is "
            "unreachable and the last table is served, expired: past the bound, nothing served)",
            labels=["deployment", "freshness"],
        )
        for state in Freshness:
            freshness.add_metric([*labels, state.value], float(state is status.freshness))
        yield freshness
        for name, documentation, value in (
            (
                "intentserve_router_table_stale_seconds",
                "seconds since the controller was last heard from (0 while fresh)",
                status.stale_for_s,
            ),
            (
                "intentserve_router_table_revision",
                "the revision of the worker table the router routes by",
                float(status.revision),
            ),
            (
                "intentserve_router_max_stale_seconds",
                "how long the router serves a stale table (spec.router.maxStaleS)",
                status.max_stale_s,
            ),
        ):
            gauge = GaugeMetricFamily(name, documentation, labels=["deployment"])
            gauge.add_metric(labels, value)
            yield gauge

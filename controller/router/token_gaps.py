"""The inter-token latency histogram, observed per token without a lock: each request counts its
gaps into buckets of its own (`GapBatch`), and the shared histogram takes a request's counts in
one locked step every `FLUSH_TOKENS` tokens and when the request ends.

    gaps = TokenGaps(registry, "intentserve_inter_token_latency_seconds", "...",
                     labels={"deployment": "d", "model_name": "m"}, buckets=ITL_BUCKETS_S)
    batch = gaps.batch()
    batch.observe(gap_s, num_tokens)   # per response: no lock, no allocation
    gaps.add(batch)                    # at the request's end (and when `batch.full`)

A scrape sees the same series as a prometheus_client Histogram's (`_bucket` by `le`, `_sum`,
`_count`); a running request's latest gaps (fewer than FLUSH_TOKENS) reach it at its next flush.
NOTE: prometheus_client's Histogram.observe takes two locks and walks its buckets in Python for
each token: 7% of a router's CPU at a token a message (docs/scale.md, run 8).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

FLUSH_TOKENS = 64  # a running request's gaps reach a scrape at least this often


class GapBatch:
    """One request's gaps since its last flush: a count per bucket (the last one +Inf)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum_s = 0.0
        self.num_pending = 0  # gaps counted since the last flush

    @property
    def full(self) -> bool:
        return self.num_pending >= FLUSH_TOKENS

    def observe(self, gap_s: float, num_tokens: int) -> None:
        """`num_tokens` gaps of `gap_s` each (a response's tokens, its gap shared out)."""
        self.counts[bisect.bisect_left(self._bounds, gap_s)] += num_tokens  # le: gap <= bound
        self.sum_s += gap_s * num_tokens
        self.num_pending += num_tokens

    def clear(self) -> None:
        self.counts = [0] * len(self.counts)
        self.sum_s = 0.0
        self.num_pending = 0


class TokenGaps:
    """A histogram of one label set, registered in `registry`, filled from requests' batches."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        *,
        labels: Mapping[str, str],
        buckets: tuple[float, ...],
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = dict(labels)
        self._bounds = tuple(sorted(buckets))
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum_s = 0.0
        self._lock = threading.Lock()  # NOTE: the gRPC and HTTP front ends run on two loops
        registry.register(self)

    def batch(self) -> GapBatch:
        return GapBatch(self._bounds)

    def add(self, batch: GapBatch) -> None:
        """Take `batch`'s gaps (then cleared)."""
        if not batch.num_pending:
            return
        with self._lock:
            self._counts = [a + b for a, b in zip(self._counts, batch.counts, strict=True)]
            self._sum_s += batch.sum_s
        batch.clear()

    def describe(self) -> Iterator[HistogramMetricFamily]:
        """Its name, for the registry's check that no two collectors share one."""
        yield HistogramMetricFamily(self._name, self._documentation, labels=tuple(self._labels))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, sum_s = list(self._counts), self._sum_s
        family = HistogramMetricFamily(self._name, self._documentation, labels=tuple(self._labels))
        les = [*(floatToGoString(b) for b in self._bounds), "+Inf"]
        cumulative, buckets = 0, []
        for le, count in zip(les, counts, strict=True):
            cumulative += count
            buckets.append((le, cumulative))
        family.add_metric(tuple(self._labels.values()), buckets, sum_s)
        yield family

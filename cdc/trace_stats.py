"""What became of the process's finished spans: exported, or dropped and why; and their Prometheus metrics.

Plain counters under a lock (:data:`STATS`), and the batch queues' own counts, written by the bounded
processor (:mod:`cdc.trace_processor`) and read at each scrape by :class:`TracingCollector`, which
:mod:`cdc.metrics` serves. Apart from OpenTelemetry's SDK, so that ``/metrics`` says the same without it:
nothing exported, nothing dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["STATS", "SpanStats", "TracingCollector"]


class SpanStats:
    """What became of the process's finished spans: plain counters under a lock, read at each scrape."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exported = 0
        self.dropped: dict[str, int] = {"queue_full": 0, "export_failed": 0, "shutdown": 0}
        # Each batch queue's count of its spans, read when asked: a queue counts without this lock (a span's
        # end takes none, cdc.trace_processor.BoundedProcessor).
        self.queues: list[Callable[[], int]] = []

    @property
    def queued(self) -> int:
        """Spans in the batch queues now."""
        return sum(count() for count in list(self.queues))


STATS = SpanStats()


class TracingCollector(Collector):
    """``cdc_tracing_spans_dropped_total{reason}``, ``cdc_tracing_spans_exported_total`` and
    ``cdc_tracing_queued_spans``, for a Prometheus registry."""

    def __init__(self, stats: SpanStats = STATS) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        s = self.stats
        dropped = CounterMetricFamily(
            "cdc_tracing_spans_dropped",
            "Spans lost (never events): queue_full, the collector slower than the spans come; "
            "export_failed, the collector refused them or could not be reached; shutdown, left at exit",
            labels=["reason"],
        )
        for reason, count in list(s.dropped.items()):
            dropped.add_metric([reason], count)
        yield dropped
        yield CounterMetricFamily("cdc_tracing_spans_exported", "Spans the collector took", value=s.exported)
        yield GaugeMetricFamily("cdc_tracing_queued_spans", "Spans waiting to be exported", value=s.queued)

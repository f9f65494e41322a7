"""cdc.trace_processor's BoundedProcessor: what ends goes to the SDK's batch queue, each span counted once
(queued, exported, or dropped with its reason), by the queue's two ways in: straight into the SDK's deque,
or through its emit() when an SDK of another version has neither."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from cdc.trace_processor import BoundedProcessor
from cdc.trace_span import SpanMaker
from cdc.trace_stats import SpanStats

ROW = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # exports when a batch is full, or flushed


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += spans
        return SpanExportResult.SUCCESS


def sent(processor: BoundedProcessor, count: int) -> None:
    maker = SpanMaker(TracerProvider(), processor.on_end, scope="t", on_end_sampled=processor.on_end_sampled)
    for i in range(count):
        span = maker.send("t", (b"k", b"e-%d" % i, b"T", b"1", b"0/1"), ROW, i + 1, 1)
        span.note_delivery(None, Partition(), end=True)


class Partition:
    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


@pytest.mark.parametrize("way", ["deque", "emit"])
def test_every_ended_span_is_exported_and_counted_once(way, monkeypatch):
    stats, kept = SpanStats(), Kept()
    processor = BoundedProcessor(kept, 64, stats)
    if way == "emit":  # an SDK whose batch processor has none of the internals the deque's way reads
        processor._queue = None
    sent(processor, 10)
    assert stats.queued == 10
    assert processor.force_flush()
    processor.shutdown()
    assert len(kept.spans) == 10 and stats.exported == 10 and stats.queued == 0
    assert [span.attributes["messaging.message.id"] for span in kept.spans] == [f"e-{i}" for i in range(10)]
    assert sum(stats.dropped.values()) == 0


def test_the_deque_is_the_sdks_own_queue():
    processor = BoundedProcessor(Kept(), 8, SpanStats())
    assert processor._queue is not None, "the SDK's internals moved: the deque's way is never taken"
    processor.shutdown()


def test_a_span_that_would_not_fit_is_dropped_and_counted_and_the_queue_never_overflows():
    stats = SpanStats()
    processor = BoundedProcessor(Kept(), 4, stats)
    processor._batch_size = 1 << 30  # the worker is not woken: the queue keeps what came in
    assert processor._queue is not None
    sent(processor, 6)
    assert stats.queued == 4 and stats.dropped["queue_full"] == 2
    assert len(processor._queue) == 4
    processor.shutdown()


def test_after_shutdown_a_span_is_dropped_and_counted():
    stats = SpanStats()
    processor = BoundedProcessor(Kept(), 8, stats)
    processor.shutdown()
    processor.abandon()
    sent(processor, 2)
    assert stats.dropped["shutdown"] == 2 and stats.queued == 0


def test_spans_ended_on_several_threads_are_each_counted_once_and_never_overflow_the_queue():
    """A span's end takes no lock: its number from an atomic count, against what left the count."""
    stats = SpanStats()
    processor = BoundedProcessor(Kept(), 100, stats)
    processor._batch_size = 1 << 30  # the worker is not woken: the queue keeps what came in
    assert processor._queue is not None
    threads = [threading.Thread(target=sent, args=(processor, 1000)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = len(processor._queue)
    assert kept == 100 and stats.queued == kept
    assert stats.dropped["queue_full"] == 4000 - kept
    processor.abandon()
    assert stats.queued == 0 and stats.dropped["shutdown"] == kept
    assert stats.queues == [], "an abandoned queue is no longer read"
    processor.shutdown()

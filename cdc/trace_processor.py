"""OpenTelemetry's SDK as outbox CDC runs it: a batch processor whose queue is bounded and counted, an
exporter that encodes with :mod:`cdc.trace_export`, and :class:`Tracing`, the handle that
:func:`cdc.tracing.start` returns. Imported only when tracing is on: the SDK is an optional extra, and costs
memory once loaded.

Ended spans go to a BatchSpanProcessor whose queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``): the thread that
ends a span only appends to it, and the processor's own thread exports, each request bounded by
``OTEL_EXPORTER_OTLP_TIMEOUT``. A span that would not fit is dropped and counted in the :class:`SpanStats`
it is given (``cdc_tracing_spans_dropped_total{reason}``), never waited for.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from cdc import trace_export

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span
    from opentelemetry.trace import Tracer

    from cdc.trace_stats import SpanStats

__all__ = ["BoundedProcessor", "CountingExporter", "Tracing"]

log = logging.getLogger("cdc.tracing")


class Tracing:
    """OpenTelemetry's SDK as :func:`start` set it up: :attr:`tracer` makes the spans, and :attr:`processor`
    (bounded, counting) exports them, the relay's own spans (:mod:`cdc.trace_span`) too; :attr:`mode` is the
    ``tracing`` setting (``row-context-only`` or ``always``)."""

    def __init__(
        self,
        mode: str,
        provider: TracerProvider,
        processor: BoundedProcessor,
        *,
        name: str,
        plain_child: Callable[[list[tuple[str, str | bytes | None]], int, int], bytes | None] | None = None,
    ) -> None:
        self.mode = mode
        # cdc._fastpath's cdc.trace_context.plain_child, when compiled (None: the relay uses Python's)
        self.plain_child = plain_child
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(name)
        self.processor = processor
        self._closed = False

    def shutdown(self, timeout: float) -> None:
        """Export what is queued, for at most ``timeout`` seconds (the caller's own shutdown bound); what is
        left then is dropped and counted (``shutdown``). Never waits longer, even with the collector gone."""
        if self._closed:
            return
        self._closed = True
        done = threading.Event()

        def close() -> None:
            self.provider.shutdown()
            done.set()

        threading.Thread(target=close, name="cdc-tracing-shutdown", daemon=True).start()
        if not done.wait(timeout):
            log.warning(
                "tracing: the collector took more than %.1f s at shutdown; its spans are dropped", timeout
            )
        self.processor.abandon()


class CountingExporter(SpanExporter):
    """The OTLP exporter, telling the processor what left its queue and counting what the collector took.

    It encodes with :mod:`cdc.trace_export` (a tenth of the library's cost, the same bytes) and hands the
    bytes to the OTLP exporter's HTTP client, which keeps its endpoint, headers, TLS, compression, timeout
    and retries. That client is not public API: when an exporter of another version has none, or a batch
    holds what cdc.trace_export leaves to the library, the exporter encodes as it always does."""

    def __init__(
        self,
        inner: SpanExporter,
        processor: BoundedProcessor,
        send_span: Callable[[ReadableSpan], bytes | None] | None = None,
    ) -> None:
        self.inner = inner
        self.processor = processor
        self._send_span = send_span  # cdc._fastpath's writer of the relay's spans, when compiled
        client = getattr(inner, "_client", None)
        self._client = client if callable(getattr(client, "export", None)) else None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.processor.taken(len(spans)):
            return SpanExportResult.FAILURE  # after shutdown's bound: counted as dropped by abandon()
        try:
            result = self._export(spans)
        except Exception:  # an exporter's bug must not end the export thread: the spans are counted
            log.exception("tracing: exporting %d spans failed", len(spans))
            result = SpanExportResult.FAILURE
        stats = self.processor.stats
        with stats.lock:
            if result is SpanExportResult.SUCCESS:
                stats.exported += len(spans)
            else:
                stats.dropped["export_failed"] += len(spans)
        return result

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = None if self._client is None else trace_export.encode(spans, self._send_span)
        if data is None:
            return self.inner.export(spans)
        sent = self._client.export(data)  # type: ignore[union-attr]  # None was ruled out above
        return SpanExportResult.SUCCESS if getattr(sent, "success", False) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BoundedProcessor(SpanProcessor):
    """A BatchSpanProcessor whose queue is never full: a span that might not fit is dropped here, and
    counted, before the SDK would drop one uncounted. The queue's count is what came in less what the
    exporter took and what was dropped; an export takes its spans just after they leave the queue, so the
    count is never below the real length."""

    def __init__(
        self,
        exporter: SpanExporter | None,
        capacity: int,
        stats: SpanStats,
        *,
        send_span: Callable[[ReadableSpan], bytes | None] | None = None,
    ) -> None:
        self.capacity = capacity
        self.stats = stats
        self.send_span = send_span
        self.abandoned = False
        # The queue's count without a lock on a span's end (its code runs once per hundred events at 1 %
        # sampled, cold, where a lock's enter and exit cost several µs): each span that comes draws a number
        # from `_came`, atomically under the GIL, whichever thread ends it; `_left` counts those that left the
        # count (taken by an export, or dropped), under the lock. Span number n finds n - _left spans counted
        # with it; a stale `_left` is smaller, never larger, so the queue never holds more than `capacity`.
        self._lock = stats.lock
        self._came = itertools.count(1)
        self._last = 0  # the last number drawn: the count's reading, for the gauge
        self._left = 0
        self._batch: BatchSpanProcessor | None = None
        self._emit: Callable[[ReadableSpan], None] | None = None
        self._queue: deque[ReadableSpan] | None = None
        self._awaken = threading.Event()
        self._batch_size = 0
        if exporter is not None:
            counting = CountingExporter(exporter, self, send_span)
            self._batch = BatchSpanProcessor(counting, max_queue_size=capacity)
            # The queue behind the processor's on_end, which tests the sampled flag again (made sure of here):
            # not public API, so its on_end when an SDK of another version has none.
            inner = getattr(self._batch, "_batch_processor", None)
            emit = getattr(inner, "emit", None)
            self._emit = emit if callable(emit) else self._batch.on_end
            # Its emit() in two steps: what it tests besides (shut down, the queue's room, a fork: a getpid()
            # call per span) this processor has tested already, and `cdc run` does not fork.
            queue, awaken = getattr(inner, "_queue", None), getattr(inner, "_worker_awaken", None)
            size = getattr(inner, "_max_export_batch_size", None)
            if isinstance(queue, deque) and isinstance(awaken, threading.Event) and isinstance(size, int):
                self._queue, self._awaken, self._batch_size = queue, awaken, size
            stats.queues.append(self.queued)

    def queued(self) -> int:
        """Spans counted and not yet taken by an export (nor dropped)."""
        return max(0, self._last - self._left)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._batch is None or span.context is None or not span.context.trace_flags.sampled:
            return  # the SDK's processor exports sampled spans only
        self.on_end_sampled(span)

    def on_end_sampled(self, span: ReadableSpan) -> None:
        """:meth:`on_end` of a span known to be sampled: its context is not read (a cdc.trace_span.SendSpan
        makes it when first read, on the export thread)."""
        if self._emit is None:
            return
        self._last = came = next(self._came)
        if came - self._left > self.capacity or self.abandoned:
            self._drop("shutdown" if self.abandoned else "queue_full")
            return
        queue = self._queue
        if queue is None:
            self._emit(span)
            return
        queue.appendleft(span)  # the SDK's exporter pops the oldest from the other end
        if len(queue) >= self._batch_size and not self._awaken.is_set():
            self._awaken.set()

    def _drop(self, reason: str) -> None:
        with self._lock:  # stats.lock
            self.stats.dropped[reason] += 1
            self._left += 1

    def taken(self, count: int) -> bool:
        """``count`` spans left the queue for an export; False once abandoned, which counted them."""
        with self._lock:  # stats.lock
            if self.abandoned:
                return False
            self._left += count
        return True

    def abandon(self) -> None:
        """After shutdown: what is still queued is lost, and counted now; the gauge no longer reads this
        queue (a process that sets tracing up again counts the new one only)."""
        with self._lock:  # stats.lock
            self.abandoned = True
            left = self.queued()
            self._left += left
            self.stats.dropped["shutdown"] += left
            if self.queued in self.stats.queues:
                self.stats.queues.remove(self.queued)

    def shutdown(self) -> None:
        if self._batch is not None:
            self._batch.shutdown()  # type: ignore[no-untyped-call]  # untyped in the SDK

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True if self._batch is None else self._batch.force_flush(timeout_millis)

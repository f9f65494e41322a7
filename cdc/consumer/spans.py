"""The consumer's spans: the service's handler runs inside a CONSUMER span ``process <topic>`` that continues
the trace of the record (the relay's ``send`` span, child of the request that wrote the outbox row), so that
the handler's own spans (its database statements, its calls) join one trace.

Owns nothing: spans are made with the service's own OpenTelemetry set-up (``opentelemetry.trace``'s global
tracer provider; the consumer never configures the SDK). A record without a ``traceparent``, or with an
unsampled one, gets no span object and costs a look through its headers; without OpenTelemetry installed
(the ``otel`` extra), :func:`handler_spans` is None and the consumer runs as without tracing.

Attributes: OpenTelemetry's messaging conventions for Kafka (``messaging.system``, the topic, partition,
offset, key and event id), the event type and version, and ``cdc.duplicate``: the idempotency guard found the
event processed before, so the handler did not run. A batch handler's span links every traced event it
processed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cdc.avro.deserialize import Event
from cdc.trace_context import find_context, is_sampled, remote_context

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the [otel] extra is not installed
    otel_trace = None  # type: ignore[assignment]

INSTRUMENTATION = "outbox-cdc.consumer"


class HandlerSpans:
    def __init__(self) -> None:
        assert otel_trace is not None
        self._tracer = otel_trace.get_tracer(INSTRUMENTATION)

    def processing(self, event: Event) -> contextlib.AbstractContextManager[Any] | None:
        """To put around one event's guard row and handler: its span, current while the handler runs; None
        (and no span object) when the record carries no sampled trace context."""
        context = find_context(event.raw_headers)
        if context is None or not is_sampled(context[0]):
            return None
        return _failing_by_type(
            self._tracer.start_as_current_span(
                f"process {event.topic}",
                context=remote_context(*context),
                kind=SpanKind.CONSUMER,
                attributes=_attributes(event),
                record_exception=False,
                set_status_on_exception=False,
            )
        )

    @contextlib.contextmanager
    def batch(self, events: list[Event]) -> Iterator[Any]:
        """Around a batch handler's call: one span linking every traced event of the batch (None without)."""
        links = []
        for event in events:
            context = find_context(event.raw_headers)
            if context is not None and is_sampled(context[0]):
                parent = remote_context(*context)
                if parent is not None:
                    links.append(Link(otel_trace.get_current_span(parent).get_span_context()))
        if not links:
            yield None
            return
        with _failing_by_type(
            self._tracer.start_as_current_span(
                f"process {events[0].topic}",
                kind=SpanKind.CONSUMER,
                links=links,
                attributes={
                    "messaging.system": "kafka",
                    "messaging.operation.type": "process",
                    "messaging.destination.name": events[0].topic,
                    "messaging.batch.message_count": len(events),
                },
                record_exception=False,
                set_status_on_exception=False,
            )
        ) as span:
            yield span


@contextlib.contextmanager
def _failing_by_type(current: contextlib.AbstractContextManager[Any]) -> Iterator[Any]:
    """``current``'s span, given an error status and an ``exception`` event when the handler raises: the
    exception's type only. Its message and stack may quote the payload, and go no further than the log
    does (OpenTelemetry's ``record_exception`` would send both to the collector)."""
    with current as span:
        try:
            yield span
        except BaseException as exc:
            kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.add_event("exception", {"exception.type": kind})
            raise


def processed(span: Any, *, duplicate: bool) -> None:
    """Note on an event's span whether the guard found it processed before (the handler did not run)."""
    if span is not None:
        span.set_attribute("cdc.duplicate", duplicate)


def handler_spans() -> HandlerSpans | None:
    """The consumer's spans, or None when OpenTelemetry is not installed."""
    return None if otel_trace is None else HandlerSpans()


def _attributes(event: Event) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": event.topic,
        "messaging.destination.partition.id": str(event.partition),
        "messaging.kafka.offset": event.offset,
        "messaging.kafka.message.key": event.key or "",
        "messaging.message.id": event.id,
        "cdc.event_type": event.event_type,
        "cdc.schema_version": event.schema_version,
    }

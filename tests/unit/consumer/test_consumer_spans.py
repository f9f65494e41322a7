"""cdc.consumer.spans: the handler's CONSUMER span, and what a failing handler tells the collector (pure:
OpenTelemetry's in-memory exporter)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cdc.avro.deserialize import Event
from cdc.consumer.spans import HandlerSpans

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "card 4111 1111 1111 1111"  # what a payload-quoting error message could carry


def event(traceparent: bytes | None = SAMPLED, offset: int = 7) -> Event:
    raw = () if traceparent is None else (("traceparent", traceparent),)
    return Event(
        id="e-1",
        event_type="OrderPlaced",
        schema_version=1,
        read_version=1,
        payload={"card": SECRET},
        headers={},
        key="o-1",
        topic="app.order",
        partition=2,
        offset=offset,
        raw_headers=raw,
    )


@pytest.fixture
def spans() -> tuple[HandlerSpans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handler_spans = HandlerSpans()
    handler_spans._tracer = provider.get_tracer("test")  # the service's provider, without the global one
    return handler_spans, exporter


def everything_sent(span) -> str:  # type: ignore[no-untyped-def]
    return repr(
        (span.status.description, dict(span.attributes), [(e.name, dict(e.attributes)) for e in span.events])
    )


def test_a_traced_record_runs_its_handler_in_a_consumer_span(spans):
    handler_spans, exporter = spans
    assert handler_spans.processing(event(None)) is None
    with handler_spans.processing(event()):  # type: ignore[union-attr]
        pass
    [done] = exporter.get_finished_spans()
    assert done.name == "process app.order" and done.kind is SpanKind.CONSUMER
    assert done.parent.span_id == 0x00F067AA0BA902B7 and done.status.status_code is StatusCode.UNSET


def test_a_failing_handler_sends_its_exceptions_type_never_its_message(spans):
    handler_spans, exporter = spans
    with pytest.raises(ValueError, match="card"), handler_spans.processing(event()):  # type: ignore[union-attr]
        raise ValueError(f"cannot charge {SECRET}")
    with pytest.raises(KeyError), handler_spans.batch([event(), event(offset=8)]):
        raise KeyError(SECRET)
    for done in exporter.get_finished_spans():
        assert done.status.status_code is StatusCode.ERROR
        assert [e.name for e in done.events] == ["exception"]
        assert dict(done.events[0].attributes)["exception.type"] in (
            "builtins.ValueError",
            "builtins.KeyError",
        )
        assert "4111" not in everything_sent(done), "the message may quote the payload: never sent"

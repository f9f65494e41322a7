"""cdc.trace_export: finished spans as OTLP bytes, the same bytes as opentelemetry's own encoder (pure)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from cdc import trace_export

REMOTE = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "a1"), ("other", "x=y")]),
)


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def finished(
    *,
    resource: Resource | None = None,
    scope: tuple[str, str | None, str | None] = ("outbox-cdc", None, None),
):
    kept = Kept()
    provider = TracerProvider(resource=resource or Resource.create({"service.name": "cdc-test"}))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    name, version, schema_url = scope
    return provider.get_tracer(name, version, schema_url=schema_url), kept


def relay_like(tracer) -> None:  # type: ignore[no-untyped-def]
    """A span as cdc.stream.spans makes one, with the attributes it sets at acknowledgement."""
    span = tracer.start_span(
        "send outbox.event.order",
        context=set_span_in_context(NonRecordingSpan(REMOTE)),
        kind=SpanKind.PRODUCER,
        start_time=1_733_550_000_000_000_000,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.destination.name": "outbox.event.order",
            "messaging.kafka.message.key": "order-17",
            "messaging.message.id": "5b8b1d0e-7d4e-4a8e-9f43-0d1a2b3c4d5e",
            "cdc.event_type": "OrderPlaced",
            "cdc.schema_version": 1,
            "cdc.commit_lsn": "0/16B3748",
        },
    )
    span.set_attribute("messaging.destination.partition.id", "3")
    span.set_attribute("messaging.kafka.offset", 1 << 40)
    span.end(end_time=1_733_550_000_250_000_000)


def library(spans) -> bytes:  # type: ignore[no-untyped-def]
    return encode_spans(spans).SerializeToString()


def test_the_relays_spans_are_the_librarys_bytes():
    tracer, kept = finished()
    for _ in range(3):
        relay_like(tracer)
    assert trace_export.encode(kept.spans) == library(kept.spans)


@pytest.mark.parametrize(
    "attributes",
    [
        {"s": "", "t": "été ✓ \x00", "long": "x" * 300},
        {"yes": True, "no": False, "zero": 0, "negative": -5, "min": -(1 << 63), "max": (1 << 63) - 1},
        {"pi": 3.25, "nzero": -0.0, "inf": float("inf")},
        {"strings": ("a", "b"), "ints": (1, -2, 300), "bools": (True, False), "floats": (1.5,), "empty": ()},
        {"k" * 200: "a key longer than 127 bytes"},
        # one-byte lengths written without a call, up to the last size that fits one byte, and just past it
        {"k": "x" * 120, "kk": "x" * 120, "key": "é" * 60, "n": "x" * 121, "m": "x" * 125, "o": "x" * 126},
    ],
)
def test_values_of_every_kind_the_sdk_allows(attributes):
    tracer, kept = finished()
    tracer.start_span("values", attributes=attributes).end()
    assert trace_export.encode(kept.spans) == library(kept.spans)


def test_kinds_status_root_and_local_parents():
    tracer, kept = finished()
    for kind in SpanKind:
        tracer.start_span(f"root {kind.name}", kind=kind).end()
    parent = tracer.start_span("parent")
    child = tracer.start_span("child", context=set_span_in_context(parent))
    child.set_status(Status(StatusCode.ERROR, "dead-lettered: bad_payload"))
    child.end()
    parent.set_status(Status(StatusCode.OK))
    parent.end()
    tracer.start_span("").end()  # an empty name is left out, as proto3 leaves out its defaults
    assert trace_export.encode(kept.spans) == library(kept.spans)


def test_resources_and_scopes_grouped_in_their_order():
    tracer_a, kept = finished(scope=("outbox-cdc", "1.2.3", "https://opentelemetry.io/schemas/1.26.0"))
    provider = TracerProvider(resource=Resource({"service.name": "other", "n": 2}, "https://schema/r"))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer_b = provider.get_tracer("psycopg")
    tracer_c = provider.get_tracer("confluent", "0.1")
    for tracer in (tracer_a, tracer_b, tracer_a, tracer_c, tracer_b):
        relay_like(tracer)
    assert trace_export.encode(kept.spans) == library(kept.spans)
    assert trace_export.encode([]) == library([]) == b""


def test_a_scope_of_its_own_attributes():
    kept = Kept()
    provider = TracerProvider(resource=Resource.create({}))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    provider.get_tracer("scoped", attributes={"lib": "x", "n": 1}).start_span("s").end()
    span = kept.spans[0]
    assert dict(span.instrumentation_scope.attributes) == {"lib": "x", "n": 1}
    assert trace_export.encode(kept.spans) == library(kept.spans)


def test_dropped_attributes_are_counted_as_the_library_counts_them():
    from opentelemetry.sdk.trace import SpanLimits

    kept = Kept()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    provider.get_tracer("t").start_span("s", attributes={"a": 1, "b": 2, "c": 3, "d": 4}).end()
    assert kept.spans[0].dropped_attributes == 2
    assert trace_export.encode(kept.spans) == library(kept.spans)


def test_events_and_links_are_left_to_the_library():
    tracer, kept = finished()
    with tracer.start_as_current_span("with an event") as span:
        span.add_event("retry", {"n": 1})
    tracer.start_span("linked", links=[Link(REMOTE, {"why": "batch"})]).end()
    for span in kept.spans:
        assert trace_export.encode([span]) is None
    relay_like(tracer)
    assert trace_export.encode(kept.spans) is None  # one such span: the whole batch goes the library's way
    assert trace_export.encode(kept.spans[-1:]) == library(kept.spans[-1:])


def test_the_kept_key_values_are_bounded_and_never_change_the_bytes(monkeypatch):
    monkeypatch.setattr(trace_export, "_PAIRS_KEPT", 3)
    tracer, kept = finished()
    for i in range(4):
        # the same values under other keys, a value seen before, and new ones past the bound
        tracer.start_span("kept", attributes={"a": "x", "b": "x", "c": f"v{i}", "d": "x", "e": f"w{i}"}).end()
    assert trace_export.encode(kept.spans) == library(kept.spans)
    assert len(trace_export._pairs) <= 3

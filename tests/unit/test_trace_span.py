"""cdc.trace_span: the relay's plain spans read, sample and encode as the SDK's own spans do (pure)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
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
from cdc.trace_span import RelaySpan, SendSpan, SpanMaker

START = 1_733_550_000_000_000_000
ATTRIBUTES = {
    "messaging.system": "kafka",
    "messaging.operation.type": "send",
    "messaging.destination.name": "outbox.event.order",
    "messaging.kafka.message.key": "order-17",
    "messaging.message.id": "5b8b1d0e-7d4e-4a8e-9f43-0d1a2b3c4d5e",
    "cdc.event_type": "OrderPlaced",
    "cdc.schema_version": 1,
    "cdc.commit_lsn": "0/16B3748",
}


class Fixed(IdGenerator):
    """The same ids for both makers, so that their spans can be compared byte for byte."""

    def generate_span_id(self) -> int:
        return 0x1122334455667788

    def generate_trace_id(self) -> int:
        return 0x0AF7651916CD43DD8448EB211C80319C


def remote(flags: int = 1, state: TraceState | None = None) -> SpanContext:
    return SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(flags),
        trace_state=state or TraceState(),
    )


def setup(**provider_args):  # type: ignore[no-untyped-def]
    kept = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "cdc-test"}), id_generator=Fixed(), **provider_args
    )
    processor = SimpleSpanProcessor(kept)
    provider.add_span_processor(processor)
    return provider, processor, kept


def both(parent: SpanContext | None, *, status: Status | None = None, **provider_args):  # type: ignore[no-untyped-def]
    """One span made by the SDK's tracer and one by SpanMaker, alike: noted and ended as the relay does."""
    provider, processor, kept = setup(**provider_args)
    sdk = provider.get_tracer("outbox-cdc").start_span(
        "send outbox.event.order",
        context=None if parent is None else set_span_in_context(NonRecordingSpan(parent)),
        kind=SpanKind.PRODUCER,
        start_time=START,
        attributes=dict(ATTRIBUTES),
    )
    ours = SpanMaker(provider, processor.on_end, scope="outbox-cdc").start(
        "send outbox.event.order", parent, dict(ATTRIBUTES), START
    )
    for span in (sdk, ours):
        span.set_attribute("messaging.destination.partition.id", "3")
        span.set_attribute("messaging.kafka.offset", 12345)
        if status is not None:
            span.set_status(status)
    ours.end()
    sdk.end(end_time=ours.end_time)
    ours_done, sdk_done = kept.get_finished_spans()
    assert isinstance(ours_done, RelaySpan)
    return sdk_done, ours_done


@pytest.mark.parametrize(
    ("parent", "status"),
    [
        (remote(), None),
        (remote(0x03, TraceState([("vendor", "a1"), ("other", "x=y")])), None),
        (None, None),  # tracing = "always", a row without a context: a new trace
        (remote(), Status(StatusCode.ERROR, "not delivered: broker down")),
    ],
    ids=["child", "random-flag-and-tracestate", "root", "error"],
)
def test_a_relay_span_encodes_to_the_sdk_spans_bytes_with_both_encoders(parent, status) -> None:
    sdk, ours = both(parent, status=status)
    assert ours.get_span_context() == sdk.get_span_context()
    library = encode_spans([sdk]).SerializeToString()
    assert encode_spans([ours]).SerializeToString() == library, "the OTLP library's encoder reads it alike"
    assert trace_export.encode([ours]) == library == trace_export.encode([sdk])


@pytest.mark.parametrize("flags", [0x01, 0x03], ids=["sampled", "sampled-and-random"])
def test_a_send_span_made_from_the_rows_fields_encodes_to_the_sdk_spans_bytes(flags) -> None:
    # What the relay makes for a row's sampled traceparent without trace state: its values made when read.
    provider, processor, kept = setup()
    parent = remote(flags)
    sdk = provider.get_tracer("outbox-cdc").start_span(
        "send outbox.event.order",
        context=set_span_in_context(NonRecordingSpan(parent)),
        kind=SpanKind.PRODUCER,
        start_time=START,
        attributes=dict(ATTRIBUTES),
    )
    maker = SpanMaker(provider, processor.on_end, scope="outbox-cdc")
    assert maker.keeps_sampled_children
    fields = (b"order-17", b"5b8b1d0e-7d4e-4a8e-9f43-0d1a2b3c4d5e", b"OrderPlaced", b"1", b"0/16B3748")
    row = b"00-%032x-%016x-%02x" % (parent.trace_id, parent.span_id, flags)
    ours = maker.send("outbox.event.order", fields, row, maker.new_span_id(), START)
    assert ours.span_id == sdk.get_span_context().span_id
    for span in (sdk, ours):
        span.set_attribute("messaging.destination.partition.id", "3")
        span.set_attribute("messaging.kafka.offset", 12345)
    ours.end()
    sdk.end(end_time=ours.end_time)
    ours_done, sdk_done = kept.get_finished_spans()
    assert isinstance(ours_done, SendSpan)
    assert ours_done.get_span_context() == sdk_done.get_span_context()
    assert ours_done.parent == sdk_done.parent
    library = encode_spans([sdk_done]).SerializeToString()
    assert encode_spans([ours_done]).SerializeToString() == library, "the OTLP encoder reads it alike"
    assert trace_export.encode([ours_done]) == library, "written from its fields (SendSpan.wire)"
    assert ours_done.attributes == sdk_done.attributes
    assert trace_export.encode([ours_done]) == library, "and once its attributes' dict was made"
    ours_done.set_attribute("late", 1)
    assert "late" not in ours_done.attributes, "an ended span is not changed"


def test_a_send_spans_attributes_set_again_read_as_a_dicts() -> None:
    provider, processor, kept = setup()
    maker = SpanMaker(provider, processor.on_end, scope="outbox-cdc")
    fields = (b"k", b"e", b"T", b"1", b"0/1")
    row = b"00-%032x-%016x-01" % (7, 8)
    late, first, made = (maker.send("t", fields, row, maker.new_span_id(), START) for _ in range(3))
    for span in (late, first, made):
        span.set_attribute("messaging.kafka.offset", 1)
        if span is first:
            span.set_attribute("messaging.destination.name", "other")  # one of its first: in its place
        span.set_attribute("messaging.kafka.offset", 2)  # set again: in its place
        if span is made:
            assert span.attributes["messaging.kafka.offset"] == 2  # its dict made before its end
        span.end()
    ours = [trace_export.encode([span]) for span in (late, first, made)]  # late's from its fields
    assert list(late.attributes) == [*attributes_of(fields, "t"), "messaging.kafka.offset"]
    assert first.attributes["messaging.destination.name"] == "other"
    for span, encoded in zip((late, first, made), ours, strict=True):
        assert encoded == encode_spans([span]).SerializeToString(), span.attributes


def attributes_of(fields, topic):  # type: ignore[no-untyped-def]
    from cdc.trace_span import send_pairs

    return dict(send_pairs(topic, *fields))


@pytest.mark.parametrize(
    "sampler",
    [
        ParentBased(ALWAYS_ON),  # OpenTelemetry's default: known to keep the child, not asked
        ALWAYS_ON,
        ParentBased(TraceIdRatioBased(0.0)),  # the ratio is for new traces: a sampled parent's child is kept
        ParentBased(ALWAYS_ON, remote_parent_sampled=TraceIdRatioBased(1.0)),  # asked
    ],
    ids=["parentbased_always_on", "always_on", "parentbased_traceidratio", "asked"],
)
def test_a_sampled_parents_child_is_kept_as_the_sdk_keeps_it(sampler) -> None:
    sdk, ours = both(remote(0x03, TraceState([("vendor", "a1")])), sampler=sampler)
    assert ours.get_span_context() == sdk.get_span_context() and ours.context.trace_flags == 0x03
    assert encode_spans([ours]).SerializeToString() == encode_spans([sdk]).SerializeToString()


def test_the_providers_sampler_decides_and_an_unsampled_span_is_not_exported() -> None:
    provider, processor, kept = setup(sampler=ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF))
    span = SpanMaker(provider, processor.on_end, scope="outbox-cdc").start("send t", remote(), {}, START)
    assert not span.get_span_context().trace_flags.sampled
    assert span.get_span_context().span_id == Fixed().generate_span_id(), "a context of its own all the same"
    span.end()
    assert kept.get_finished_spans() == ()


def test_a_ratio_sampler_on_a_new_trace_is_honoured() -> None:
    provider, processor, kept = setup(sampler=TraceIdRatioBased(0.0))
    SpanMaker(provider, processor.on_end, scope="outbox-cdc").start("send t", None, {}, START).end()
    assert kept.get_finished_spans() == ()


def test_an_ended_span_is_left_as_it_is() -> None:
    provider, processor, kept = setup()
    maker = SpanMaker(provider, processor.on_end, scope="outbox-cdc")
    span = maker.start("send t", remote(), {"a": 1}, START)
    span.end()
    ended = span.end_time
    span.set_attribute("a", 2)
    span.set_status(Status(StatusCode.ERROR, "late"))
    span.end()
    assert len(kept.get_finished_spans()) == 1 and span.end_time == ended
    assert span.attributes == {"a": 1} and span.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize(
    ("variable", "value", "usable"),
    [
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "8", False),
        ("OTEL_ATTRIBUTE_COUNT_LIMIT", "8", False),
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10", False),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10", False),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "64", True),
    ],
)
def test_span_limits_the_relays_spans_would_break_leave_them_to_the_sdk(
    monkeypatch, variable, value, usable
) -> None:
    monkeypatch.setenv(variable, value)
    provider, processor, _ = setup()
    assert SpanMaker(provider, processor.on_end, scope="outbox-cdc").usable is usable

"""The relay's spans at their own interface, with OpenTelemetry's in-memory exporter: which events get one,
its parent, its times and attributes, the headers that carry it, and when it ends in each delivery mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cdc.stream.spans import RelaySpans, end_all
from cdc.trace_context import replace_context

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
COMMIT_US = 1_796_000_000_123_456


class Msg:
    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 41


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def relay(exporter: InMemorySpanExporter, mode: str = "row-context-only", *, ends_at_ack: bool = True):
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracing = SimpleNamespace(
        tracer=provider.get_tracer("test"),
        mode=mode,
        provider=provider,
        processor=processor,
        plain_child=None,  # cdc.trace_context's (the compiled one is held to it in test_trace_context.py)
    )
    held: list = []

    def track(span) -> bool:
        if not ends_at_ack:
            held.append(span)
        return ends_at_ack

    return RelaySpans(tracing, track=track), held  # type: ignore[arg-type]


def start(spans: RelaySpans, headers):
    base = [("id", b"e-1"), ("event_type", b"OrderPlaced")]
    return spans.start(
        base + headers, headers, "app.order", b"o-1", b"e-1", b"OrderPlaced", b"1", b"0/3E8", COMMIT_US
    )


def test_a_sampled_row_gets_a_producer_span_from_its_commit_and_the_record_carries_it(exporter):
    spans, _ = relay(exporter)
    span, headers = start(spans, [("traceparent", SAMPLED), ("tracestate", b"k=v"), ("tenant", b"acme")])
    ctx = span.get_span_context()
    assert [k for k, _ in headers].count("traceparent") == 1
    carried = dict(headers)["traceparent"].decode()
    assert carried == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01" and dict(headers)["tenant"] == b"acme"
    assert dict(headers)["tracestate"] == b"k=v"
    reported = []
    spans.delivered(span, lambda err, msg: reported.append(err))(None, Msg())
    assert reported == [None], "the pipeline's own delivery callback still runs"
    [done] = exporter.get_finished_spans()
    assert done.name == "send app.order" and done.kind is SpanKind.PRODUCER
    assert done.parent.span_id == 0x00F067AA0BA902B7 and done.context.trace_id == ctx.trace_id
    assert done.start_time == COMMIT_US * 1000
    attributes = dict(done.attributes)
    assert (
        attributes["messaging.system"] == "kafka" and attributes["messaging.destination.name"] == "app.order"
    )
    assert attributes["messaging.message.id"] == "e-1" and attributes["messaging.kafka.message.key"] == "o-1"
    assert (
        attributes["messaging.destination.partition.id"] == "2" and attributes["messaging.kafka.offset"] == 41
    )
    assert attributes["cdc.event_type"] == "OrderPlaced" and attributes["cdc.commit_lsn"] == "0/3E8"


def test_an_unsampled_row_passes_through_without_a_span_object(exporter):
    spans, _ = relay(exporter)
    assert start(spans, [("traceparent", UNSAMPLED)]) is None
    assert start(spans, []) is None, "row-context-only: no context, no span"
    assert exporter.get_finished_spans() == ()


def test_always_traces_a_row_without_context_as_a_new_trace(exporter):
    spans, _ = relay(exporter, "always")
    span, headers = start(spans, [])
    assert "traceparent" in dict(headers) and span.parent is None


def test_exactly_once_ends_the_spans_with_the_kafka_transaction(exporter):
    spans, held = relay(exporter, ends_at_ack=False)
    first, _ = start(spans, [("traceparent", SAMPLED)])
    spans.delivered(first, lambda err, msg: None)(None, Msg())
    assert exporter.get_finished_spans() == (), "acknowledged, not committed: not over"
    end_all(held, committed=True)
    assert [s.status.status_code for s in exporter.get_finished_spans()] == [StatusCode.UNSET]
    second, _ = start(spans, [("traceparent", SAMPLED)])
    spans.delivered(second, lambda err, msg: None)  # produced; its transaction aborts before the report
    end_all(held, committed=False)
    aborted = exporter.get_finished_spans()[-1]
    assert aborted.status.status_code is StatusCode.ERROR and "aborted" in aborted.status.description
    assert held == []


def test_a_dead_letters_span_says_the_reason(exporter):
    spans, _ = relay(exporter)
    headers = spans.dead_lettered([("traceparent", SAMPLED)], "app.dlq", "e-1", "schema_not_found", COMMIT_US)
    [done] = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR and "schema_not_found" in done.status.description
    assert dict(done.attributes)["cdc.dead_letter_reason"] == "schema_not_found"
    assert dict(headers)["traceparent"] != SAMPLED, "the dead letter carries its own span's context"


@pytest.mark.parametrize("traceparent", [UNSAMPLED, SAMPLED.upper()], ids=["unsampled", "not-valid"])
def test_a_dead_letter_whose_parent_is_not_sampled_keeps_the_rows_context(exporter, traceparent):
    spans, _ = relay(exporter, "always")
    row = [("traceparent", traceparent), ("tracestate", b"k=v")]
    assert spans.dead_lettered(row, "app.dlq", "e-1", "schema_not_found", COMMIT_US) is row
    assert exporter.get_finished_spans() == ()


def test_a_record_never_sent_ends_its_span_once_with_the_reason(exporter, caplog):
    """Too large for Kafka: dead-lettered before it was sent. Exactly once, its span was already held for
    the Kafka transaction's end, which must not end it a second time (the SDK warns at each)."""
    spans, held = relay(exporter, ends_at_ack=False)
    span, _ = start(spans, [("traceparent", SAMPLED)])
    spans.delivered(span, lambda err, msg: None)  # held for the transaction, then the produce refused it
    spans.not_sent(span, "too_large")
    end_all(held, committed=True)
    [done] = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR and done.status.description == "not sent: too_large"
    assert "ended span" not in caplog.text


def test_a_span_that_fails_never_costs_the_acknowledgement(exporter, caplog):
    spans, _ = relay(exporter)

    class Broken:
        def set_attribute(self, key, value):
            raise TypeError("a bug in the span's code")

    span = Broken()
    reported = []
    report = spans.delivered(span, lambda err, msg: reported.append(msg.offset()))
    report(None, Msg())
    report(None, Msg())
    assert reported == [41, 41]
    assert caplog.text.count("noting a delivery on its span failed") == 1


def test_the_relay_makes_plain_spans_and_leaves_tight_span_limits_to_the_sdk(exporter, monkeypatch):
    spans, _ = relay(exporter)
    span, _ = start(spans, [("traceparent", SAMPLED)])
    assert type(span).__name__ == "SendSpan", "a sampled event costs no SDK Span object"
    span, _ = start(spans, [("traceparent", SAMPLED), ("tracestate", b"k=v")])
    assert type(span).__name__ == "RelaySpan", "nor with a trace state"
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    spans, _ = relay(exporter)
    span, headers = start(spans, [("traceparent", SAMPLED)])
    assert type(span).__name__ not in ("RelaySpan", "SendSpan")
    spans.delivered(span, lambda err, msg: None)(None, Msg())
    done = exporter.get_finished_spans()[-1]
    assert len(done.attributes) == 4 and done.dropped_attributes == 6, "the SDK enforced the limit"
    assert dict(headers)["traceparent"].decode().split("-")[1] == SAMPLED.decode().split("-")[1]


@pytest.mark.parametrize("flags", [b"01", b"03"], ids=["sampled", "sampled-and-random"])
def test_the_records_traceparent_is_the_send_spans_context_as_the_sdk_writes_it(exporter, flags):
    # The relay cuts it from the row's bytes; replace_context formats it from the span's context.
    spans, _ = relay(exporter)
    row = [("traceparent", SAMPLED[:-2] + flags), ("tenant", b"acme")]
    span, headers = start(spans, row)
    ctx = span.get_span_context()
    assert ctx.trace_flags == int(flags, 16) and ctx.span_id != 0x00F067AA0BA902B7
    base = [("id", b"e-1"), ("event_type", b"OrderPlaced")]
    assert headers == replace_context(base + row, span)
    assert headers[2] == ("traceparent", b"00-%032x-%016x-%b" % (ctx.trace_id, ctx.span_id, flags))


TRACEPARENTS = [
    SAMPLED,
    SAMPLED[:-2] + b"03",
    SAMPLED[:-2] + b"00",
    SAMPLED[:-2] + b"02",
    SAMPLED[:-2] + b"05",  # sampled, with a flag this version does not know: the general path
    SAMPLED[:-2] + b"11",
    SAMPLED.upper(),
    SAMPLED[:3] + SAMPLED[3:35].upper() + SAMPLED[35:],
    SAMPLED[:36] + SAMPLED[36:52].upper() + SAMPLED[52:],
    b"00-" + b"0" * 32 + SAMPLED[35:],
    SAMPLED[:36] + b"0" * 16 + SAMPLED[52:],
    b"ff" + SAMPLED[2:],
    b"01" + SAMPLED[2:],  # a later version: its known fields taken
    b"01" + SAMPLED[2:] + b"-later",
    SAMPLED + b"-more",
    b" " + SAMPLED,
    SAMPLED[:-1],
    SAMPLED[:10] + b"g" + SAMPLED[11:],
    SAMPLED[:35] + b"_" + SAMPLED[36:],
    b"",
]


@pytest.mark.parametrize("traceparent", TRACEPARENTS)
def test_the_fast_path_takes_only_what_the_parser_takes_and_reads_the_same_ids(exporter, traceparent):
    from cdc.trace_context import parse_traceparent

    spans, _ = relay(exporter)
    started = start(spans, [("traceparent", traceparent)])
    parsed = parse_traceparent(traceparent)
    if parsed is None or not parsed[2] & 1:
        assert started is None
        return
    span, headers = started
    ctx, parent = span.get_span_context(), span.parent
    assert (parent.trace_id, parent.span_id) == parsed[:2] and ctx.trace_id == parsed[0]
    # The child keeps the sampled flag and the random one (the SDK's way); the parent is as it came.
    assert ctx.trace_flags == 1 | parsed[2] & 2 and parent.trace_flags == parsed[2]
    base = [("id", b"e-1"), ("event_type", b"OrderPlaced")]
    assert headers == replace_context([*base, ("traceparent", b"")], span)
    fast = traceparent[:3] == b"00-" and len(traceparent) == 55 and traceparent[-2:] in (b"01", b"03")
    assert (type(span).__name__ == "SendSpan") == fast


@pytest.mark.parametrize("err", [None, "KafkaError{code=_MSG_TIMED_OUT}"], ids=["acknowledged", "failed"])
@pytest.mark.parametrize("ends", [True, False], ids=["at-least-once", "exactly-once"])
def test_a_send_spans_delivery_is_noted_as_the_sdks_span_would_note_it(exporter, err, ends, monkeypatch):
    spans, held = relay(exporter, ends_at_ack=ends)
    ours, _ = start(spans, [("traceparent", SAMPLED)])
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "16")  # still the relay's own, by the generic way
    theirs, _ = start(spans, [("traceparent", SAMPLED), ("tracestate", b"k=v")])
    assert type(ours).__name__ == "SendSpan" and type(theirs).__name__ == "RelaySpan"
    for span in (ours, theirs):
        spans.delivered(span, lambda e, m: None)(err, Msg())
    if not ends:
        assert exporter.get_finished_spans() == ()
        end_all(held, committed=True)
    ours_done, theirs_done = exporter.get_finished_spans()
    assert ours_done.attributes == {**theirs_done.attributes, "messaging.message.id": "e-1"}
    assert ours_done.status.status_code == theirs_done.status.status_code
    assert ours_done.status.description == theirs_done.status.description
    if err is None:
        assert ours_done.attributes["messaging.kafka.offset"] == 41
        assert ours_done.attributes["messaging.destination.partition.id"] == "2"
    else:
        assert ours_done.status.description == f"not delivered: {err}"

"""cdc.trace_context: the W3C trace context of rows and records, and Debezium's Properties column (pure)."""

from __future__ import annotations

import random
import re

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import TraceState

from cdc import fastpath
from cdc.trace_context import (
    context_headers,
    current_headers,
    find_context,
    format_traceparent,
    is_sampled,
    parse_traceparent,
    plain_child,
    properties_context,
    remote_context,
    replace_context,
    replace_headers,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{SPAN}-01".encode()
UNSAMPLED = f"00-{TRACE}-{SPAN}-00".encode()


def test_a_valid_traceparent_is_read():
    assert parse_traceparent(SAMPLED) == (int(TRACE, 16), int(SPAN, 16), 1)
    assert parse_traceparent(SAMPLED.decode()) == (int(TRACE, 16), int(SPAN, 16), 1)
    # A later version may add fields; its first four are read as version 00's.
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-03-what-comes-next".encode()) == (
        int(TRACE, 16),
        int(SPAN, 16),
        3,
    )


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"00-x-y-01",
        f"00-{TRACE.upper()}-{SPAN}-01".encode(),  # upper-case hex
        f"ff-{TRACE}-{SPAN}-01".encode(),  # version ff is invalid
        f"00-{TRACE}-{SPAN}-01-extra".encode(),  # version 00 is exactly 55 characters
        f"00-{'0' * 32}-{SPAN}-01".encode(),
        f"00-{TRACE}-{'0' * 16}-01".encode(),
        f"00-{TRACE[:-1]}-{SPAN}-01".encode(),
        f"00_{TRACE}_{SPAN}_01".encode(),
        "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01".encode(),
    ],
)
def test_an_invalid_traceparent_is_ignored(value):
    assert parse_traceparent(value) is None
    assert not is_sampled(value)
    assert remote_context(value) is None


def test_sampled_is_the_flags_low_bit():
    assert is_sampled(SAMPLED)
    assert not is_sampled(UNSAMPLED)
    assert is_sampled(f"00-{TRACE}-{SPAN}-03".encode())  # another flag beside sampled
    assert not is_sampled(f"00-{TRACE}-{SPAN}-02".encode())
    assert not is_sampled(f"00-{'0' * 32}-{SPAN}-01".encode())  # valid-looking flags, invalid id
    # A later version: the flags are not the last byte.
    assert is_sampled(f"01-{TRACE}-{SPAN}-01-future".encode())
    assert not is_sampled(f"01-{TRACE}-{SPAN}-00-future1".encode())


def test_find_context_takes_the_first_of_each():
    headers = [
        ("id", b"1"),
        ("tracestate", b"a=1"),
        ("traceparent", SAMPLED),
        ("traceparent", UNSAMPLED),
        ("tracestate", b"b=2"),
    ]
    assert find_context(headers) == (SAMPLED, b"a=1")
    assert find_context([("traceparent", SAMPLED)]) == (SAMPLED, None)
    assert find_context([("tracestate", b"a=1"), ("id", b"x")]) is None
    assert find_context([("traceparent", None)]) == (b"", None)


def test_a_remote_context_round_trips_to_the_same_headers():
    ctx = remote_context(SAMPLED, b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert ctx is not None
    span_context = trace.get_current_span(ctx).get_span_context()
    assert span_context.is_remote and span_context.trace_flags.sampled
    assert context_headers(span_context) == [
        ("traceparent", SAMPLED),
        ("tracestate", b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
    ]
    unsampled = remote_context(UNSAMPLED)
    assert unsampled is not None
    assert not trace.get_current_span(unsampled).get_span_context().trace_flags.sampled
    # A tracestate that does not parse is dropped, the parent kept.
    bad_state = remote_context(SAMPLED, "not a tracestate")
    assert bad_state is not None
    assert context_headers(trace.get_current_span(bad_state)) == [("traceparent", SAMPLED)]


def test_a_child_span_replaces_the_rows_context_and_java_reads_its_bytes():
    """The header as opentelemetry-java's Kafka instrumentation reads it: key ``traceparent``, value the UTF-8
    of ``00-<32 lower hex>-<16 lower hex>-<2 hex>`` (W3CTraceContextPropagator), taken from the record's
    LAST header of the name (KafkaConsumerRecordGetter uses lastHeader): so there must be exactly one."""
    tracer = TracerProvider().get_tracer("test")
    parent = remote_context(SAMPLED, b"rojo=00f067aa0ba902b7")
    row = [("id", b"e-1"), ("traceparent", SAMPLED), ("x", b"y"), ("tracestate", b"rojo=00f067aa0ba902b7")]
    with tracer.start_as_current_span("send outbox.event.order", context=parent) as span:
        headers = replace_context(row, span)
    ctx = span.get_span_context()
    assert [k for k, _ in headers] == ["id", "traceparent", "tracestate", "x"]
    value = dict(headers)["traceparent"]
    assert re.fullmatch(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-01", value)
    assert value == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01".encode()
    assert value[3:35] == TRACE.encode() and value[36:52] != SPAN.encode()  # same trace, new parent
    assert [k for k, _ in headers].count("traceparent") == 1
    assert dict(headers)["tracestate"] == b"rojo=00f067aa0ba902b7"
    # No context in the row: added at the end.
    assert replace_context([("id", b"e-2")], span)[1] == ("traceparent", value)


def test_current_headers_are_the_active_spans():
    assert current_headers() == {}
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        ctx = span.get_span_context()
        assert current_headers() == {
            "traceparent": format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags)
        }
    state = TraceState([("vendor", "v1")])
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(0), trace_state=state)
        )
    )
    with tracer.start_as_current_span("unsampled", context=parent):
        headers = current_headers()
    # The unsampled decision travels too.
    assert headers["traceparent"].endswith("-00") and headers["tracestate"] == "vendor=v1"


DEBEZIUM = (
    b"#Thu Oct 30 10:15:02 UTC 2025\n"
    b"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"
    b"tracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\n"
)


def test_debeziums_span_context_column_is_read():
    assert properties_context(DEBEZIUM) == (
        ("traceparent", SAMPLED),
        ("tracestate", b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (b"traceparent: " + SAMPLED, (("traceparent", SAMPLED),)),
        (b"  traceparent " + SAMPLED + b"\r\n! a comment", (("traceparent", SAMPLED),)),
        (
            b"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-\\\n    00f067aa0ba902b7-01",
            (("traceparent", SAMPLED),),
        ),
        (b"trace\\u0070arent=" + SAMPLED, (("traceparent", SAMPLED),)),
        (b"traceparent=" + UNSAMPLED + b"\ntraceparent=" + SAMPLED, (("traceparent", SAMPLED),)),  # the last
        (b"#only a comment\nuber-trace-id=abc:def:0:1", ()),
        (b"", ()),
    ],
)
def test_java_properties_forms(text, want):
    assert properties_context(text) == want


ROW = [("id", b"e-1"), ("event_type", b"OrderPlaced")]  # a record's own headers, before the row's
PLAIN = [
    SAMPLED,
    f"00-{TRACE}-{SPAN}-03".encode(),  # the random bit: kept
]
NOT_PLAIN = [
    UNSAMPLED,
    f"00-{TRACE}-{SPAN}-05".encode(),  # another flag set: the general path
    f"01-{TRACE}-{SPAN}-01".encode(),
    f"00-{TRACE.upper()}-{SPAN}-01".encode(),
    f"00-{'0' * 32}-{SPAN}-01".encode(),
    f"00-{TRACE}-{'0' * 16}-01".encode(),
    SAMPLED + b"-x",
    SAMPLED[:-1],
    b" " + SAMPLED[:-1],
    b"",
    None,
    SAMPLED.decode(),  # a str: not what a row's headers hold
]


@pytest.mark.parametrize("value", PLAIN)
def test_plain_child_replaces_a_plain_sampled_traceparent_in_its_place(value):
    headers = [*ROW, ("x", b"1"), ("traceparent", value), ("y", b"2")]
    before = list(headers)
    assert plain_child(headers, len(ROW), 0x1122334455667788) is value
    child = value[:36] + b"1122334455667788" + value[52:]
    assert headers == replace_headers(before, [("traceparent", child)])  # what the general path writes
    assert parse_traceparent(child) == (int(TRACE, 16), 0x1122334455667788, value[54] - ord("0"))


@pytest.mark.parametrize(
    "headers",
    [
        *([("traceparent", value)] for value in NOT_PLAIN),
        [("traceparent", SAMPLED), ("tracestate", b"rojo=1")],  # a trace state: the general path keeps it
        [("tracestate", b"rojo=1"), ("traceparent", SAMPLED)],
        [("traceparent", SAMPLED), ("traceparent", SAMPLED)],  # two: the general path keeps the first
        [("x", b"1")],
        [],
    ],
)
def test_plain_child_leaves_anything_else_as_it_came(headers):
    record = [*ROW, *headers]
    before = list(record)
    assert plain_child(record, len(ROW), 7) is None
    assert record == before


def test_plain_child_reads_only_the_rows_headers_and_takes_only_an_sdk_span_id():
    record = [("traceparent", SAMPLED), ("x", b"1")]  # before `first`: not the row's
    assert plain_child(record, 1, 7) is None
    for span_id in (0, -1, 1 << 64):
        assert plain_child([("traceparent", SAMPLED)], 0, span_id) is None
    assert plain_child([("traceparent", SAMPLED)], -1, 7) is None


def test_the_compiled_plain_child_is_pythons(compiled_extension):
    """cdc._fastpath.plain_child against cdc.trace_context.plain_child: the same answer and the same list
    after, over generated rows (their headers as cdc.stream.route.parse_headers makes them)."""
    compiled = fastpath.extension.plain_child  # type: ignore[union-attr]
    rng = random.Random(20261208)
    values = [*PLAIN, *NOT_PLAIN, b"00-" + b"f" * 32 + b"-" + b"f" * 16 + b"-01"]
    keys = ["traceparent", "tracestate", "x", "Traceparent", b"traceparent"]
    for _ in range(20_000):
        row = [(rng.choice(keys), rng.choice([*values, b"v"])) for _ in range(rng.randrange(4))]
        if rng.random() < 0.5:
            row.insert(rng.randrange(len(row) + 1), ("traceparent", rng.choice(values)))
        first = rng.choice([0, 1, 2, -1])
        span_id = rng.choice([1, 0x1122334455667788, (1 << 64) - 1, rng.getrandbits(64), 0, 1 << 64])
        ours, theirs = [*ROW[: max(first, 0)], *row], [*ROW[: max(first, 0)], *row]
        answer = plain_child(ours, first, span_id)
        assert compiled(theirs, first, span_id) == answer, (row, first, span_id)
        assert theirs == ours

"""The compiled writer of the relay's spans (cdc._fastpath.send_span) against the Python one it stands in for
(cdc.trace_export._send_span of the span's wire()): wherever it returns bytes, they are the Python path's,
byte for byte; wherever it returns None, the Python path writes the span (or raises its own error). Spans:
the relay's usual, then generated ones with every field's odd values, delivered or failed, ended or not."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from cdc import fastpath, trace_export
from cdc.trace_span import SendSpan, SpanMaker

pytestmark = pytest.mark.usefixtures("compiled_extension")

START = 1_796_000_000_123_456_000
ROW = b"00-%032x-%016x-01" % (7, 8)  # a row's traceparent: trace 7, parent 8
FIELDS = (b"order-17", b"5b8b1d0e-7d4e-4a8e-9f43-0d1a2b3c4d5e", b"OrderPlaced", b"1", b"0/16B3748")


def maker() -> SpanMaker:
    return SpanMaker(TracerProvider(), lambda span: None, scope="outbox-cdc")


def python(span: SendSpan) -> bytes | Exception:
    try:
        return trace_export._send_span(*span.wire())
    except Exception as exc:  # noqa: BLE001 - the Python path's own error is an outcome too
        return exc


def compiled(span: SendSpan) -> bytes | None:
    assert fastpath.extension is not None
    return fastpath.extension.send_span(span)  # type: ignore[no-any-return]


class Delivered:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def test_the_relays_usual_span_is_written_alike() -> None:
    row = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    span = maker().send("outbox.event.order", FIELDS, row, 0x1122334455667788, START)
    span.note_delivery(None, Delivered(3, 12345), True)
    data = compiled(span)
    assert data is not None and data == python(span)
    # The request it goes in is the Python encoder's, and so the library's (tests/unit/test_trace_export.py).
    assert trace_export.encode([span], compiled) == trace_export.encode([span])


TEXTS: list[Any] = [b"", b"k", "str-key", None, "é✓ üñí", "é✓".encode(), b"\xff\xfe", "x" * 300, b"y" * 130]
VERSIONS: list[Any] = [
    b"1",
    b"0007",
    b"123456789012345678",
    b"1234567890123456789",
    b"-1",
    b" 2",
    b"1_0",
    b"",
    b"x",
    3,
    True,
    -5,
    1 << 63,
    "4",
]
LSNS: list[Any] = [b"0/16B3748", b"FFFFFFFF/FFFFFFFF", b"\xff", b""]
LATE: list[Any] = [
    "3",
    12345,
    -1,
    0,
    1 << 62,
    -(1 << 63),
    (1 << 63),
    True,
    False,
    1.5,
    float("nan"),
    None,
    b"raw",
    ("a", 1),
    "é✓",
]
STATUSES = [
    Status(StatusCode.UNSET),
    Status(StatusCode.OK),
    Status(StatusCode.ERROR, "not delivered: KafkaError{code=_MSG_TIMED_OUT}"),
    Status(StatusCode.ERROR),
    Status(StatusCode.ERROR, "é" * 100),
]


def generated(rng: random.Random) -> SendSpan:
    fields = (rng.choice(TEXTS), rng.choice(TEXTS), rng.choice(TEXTS), rng.choice(VERSIONS), rng.choice(LSNS))
    topic = rng.choice(["outbox.event.order", "t", "é-topic", "z" * 200])
    trace_id = rng.choice([1, (1 << 128) - 1, rng.getrandbits(128)])
    parent_id = rng.choice([1, (1 << 64) - 1, rng.getrandbits(64)])
    start = rng.choice([START, 0, 1, (1 << 64) - 1])
    row = b"00-%032x-%016x-0%d" % (trace_id, parent_id, rng.choice([1, 3]))
    span_id = rng.choice([1, (1 << 64) - 1, rng.getrandbits(64) or 1])
    span = maker().send(topic, fields, row, span_id, start)  # type: ignore[arg-type]
    for _ in range(rng.randrange(3)):
        span.set_attribute(rng.choice(["late.a", "late.b", "messaging.kafka.offset", "é"]), rng.choice(LATE))
    if rng.random() < 0.3:
        span.set_status(rng.choice(STATUSES))
    if rng.random() < 0.2:
        try:
            span.attributes  # noqa: B018 - its dict made: the compiled writer leaves it to Python
        except (ValueError, UnicodeDecodeError):  # fields int() or decode() refuse: made in vain
            pass
    if rng.random() < 0.8:
        err = None if rng.random() < 0.7 else "KafkaError{code=_MSG_TIMED_OUT}"
        span.note_delivery(err, Delivered(rng.randrange(64), rng.randrange(1 << 40)), rng.random() < 0.9)
    return span


def test_generated_spans_are_written_alike_or_left_to_python() -> None:
    rng = random.Random(40)
    written = left = 0
    for _ in range(5000):
        span = generated(rng)
        data = compiled(span)
        if data is None:
            left += 1
            continue
        written += 1
        assert data == python(span), span.wire()
    # Most are plain enough to be written; the odd ones are what Python takes.
    assert written > 500 and left > 500, (written, left)


@pytest.mark.parametrize(
    ("fields", "late"),
    [
        (FIELDS, {}),
        (
            (None, "é✓", "T", 2, b"0/1"),
            {"messaging.destination.partition.id": "0", "messaging.kafka.offset": 0},
        ),
        ((b"k", b"e", b"T", b"18", b"0/1"), {"a": True, "b": -(1 << 63), "c": 2.5, "d": None}),
    ],
)
def test_plain_spans_are_all_written(fields: Any, late: dict[str, Any]) -> None:
    span = maker().send("t", fields, ROW, 9, START)
    for key, value in late.items():
        span.set_attribute(key, value)
    span.end()
    data = compiled(span)
    assert data is not None and data == python(span)


@pytest.mark.parametrize(
    "odd",
    [
        {"fields": (b"\xff", b"e", b"T", b"1", b"0/1")},  # not UTF-8: Python replaces it
        {"fields": (b"k", b"e", b"T", b" 1", b"0/1")},  # int() takes spaces
        {"fields": (b"k", b"e", b"T", b"1", b"\xff")},  # Python raises
        {"late": {"raw": b"bytes"}},
        {"late": {"seq": ("a", "b")}},
        {"late": {"big": 1 << 63}},
        {"attributes": True},
    ],
)
def test_what_it_is_not_sure_of_is_left_to_python(odd: dict[str, Any]) -> None:
    span = maker().send("t", odd.get("fields", FIELDS), ROW, 9, START)
    for key, value in odd.get("late", {}).items():
        span.set_attribute(key, value)
    if odd.get("attributes"):
        span.attributes  # noqa: B018
    span.end()
    assert compiled(span) is None

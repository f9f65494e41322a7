"""The dead-letter path at its own interface, with a fake sender: the record it makes, its reduced form
when the full one does not fit, and the poison-flood brake."""

from __future__ import annotations

import pytest

from cdc.config_loader import load_settings
from cdc.errors import EventTooLargeError, PayloadInvalidError
from cdc.stream import deadletters as deadletters_module
from cdc.stream.checkpoint import AckTracker, SourceTransaction
from cdc.stream.deadletters import REDUCED_HEADER, DeadLetters
from cdc.stream.route import OutboxEvent


class FakeSender:
    def __init__(self, refuse_full: bool = False) -> None:
        self.sent: list[tuple] = []
        self.refuse_full = refuse_full

    def refusal(self, topic, key, value, headers, limit):
        if self.refuse_full and value is not None:
            return EventTooLargeError("too large for the topic")
        return None

    def send(self, topic, key, value, headers, on_delivery, timestamp_ms=None):
        self.sent.append((topic, key, value, dict(headers)))


class FakeSink:
    def record_limit(self, topic):
        return None


def dead_letters(sender: FakeSender, **overrides) -> tuple[DeadLetters, SourceTransaction]:
    settings = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"dlq_topic": "app.dlq", **overrides},
    )
    current = SourceTransaction()
    current.begin(AckTracker().begin(77, 1000, 1_796_000_000_000_000), b"0/3E8", b"77", 1_796_000_000_000)
    parts = DeadLetters(
        settings,
        FakeSink(),  # type: ignore[arg-type]
        sender,  # type: ignore[arg-type]
        current,
        ensure_topic=lambda topic: None,
        extra_headers=[],
        trace=False,
    )
    return parts, current


def event(n: int = 1) -> OutboxEvent:
    return OutboxEvent(
        id=f"e-{n}",
        aggregate_type="order",
        aggregate_id=b"o-1",
        event_type="OrderPlaced",
        schema_version=1,
        payload=b'{"x": 1}',
        headers=(("traceparent", b"00-abc"),),
    )


def test_a_dead_letter_carries_its_reason_the_events_fields_and_its_own_headers():
    sender = FakeSender()
    parts, _ = dead_letters(sender)
    parts.event(event(), PayloadInvalidError("field x: not a string"), "app.order")
    ((topic, key, value, headers),) = sender.sent
    assert (topic, key, value) == ("app.dlq", b"o-1", b'{"x": 1}')
    assert headers["error_reason"] == b"payload_invalid" and headers["original_topic"] == b"app.order"
    assert headers["commit_lsn"] == b"0/3E8" and headers["xid"] == b"77" and headers["id"] == b"e-1"
    assert headers["commit_time"].startswith(b"2026-") and headers["traceparent"] == b"00-abc"
    assert parts.by_reason == {"payload_invalid": 1}


def test_a_dead_letter_too_large_for_its_topic_goes_reduced():
    sender = FakeSender(refuse_full=True)
    parts, _ = dead_letters(sender)
    parts.event(event(), PayloadInvalidError("bad"), "app.order")
    ((_, key, value, headers),) = sender.sent
    assert value is None and REDUCED_HEADER in headers and "traceparent" not in headers


def test_the_flood_brake_stops_the_run_after_max_dead_letters_within_the_window(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(deadletters_module.time, "monotonic", lambda: clock[0])
    parts, _ = dead_letters(FakeSender(), max_dead_letters=3, dead_letter_window=10)
    for n in range(2):
        parts.event(event(n), PayloadInvalidError("bad"), "")
        clock[0] += 4
    assert parts.flood is None and parts.in_window() == 2
    clock[0] += 3  # the first is 11 s old: outside the window, the third does not stop the run
    parts.event(event(3), PayloadInvalidError("bad"), "")
    assert parts.flood is None
    parts.event(event(4), PayloadInvalidError("bad"), "")
    assert parts.flood is not None and "3 dead letters within" in str(parts.flood)
    assert parts.flood.exit_code == 1


def test_on_invalid_event_stop_raises_instead():
    parts, _ = dead_letters(FakeSender(), on_invalid_event="stop")
    with pytest.raises(PayloadInvalidError):
        parts.event(event(), PayloadInvalidError("bad"), "")

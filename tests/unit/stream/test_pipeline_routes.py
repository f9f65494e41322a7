"""What the pipeline keeps per free-text value of a row (aggregate types, event types): bounded, and never a
failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc.config_loader import load_settings
from cdc.errors import AggregateTypeNotAllowedError, InvalidTopicError
from cdc.stream import pipeline as pipeline_module
from cdc.stream import route as route_module
from cdc.stream.messages import LogicalMessage
from cdc.stream.pipeline import Pipeline

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


class _Sink:
    """Enough of KafkaSink for routing: every topic exists."""

    def ensure_topic(self, topic: str) -> None:
        pass

    def record_limit(self, topic: str) -> None:
        return None


def pipeline(**overrides) -> Pipeline:
    settings = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"schemas_dir": str(SCHEMAS), **overrides},
    )
    return Pipeline(settings, sink=_Sink())  # type: ignore[arg-type]


def test_the_route_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(pipeline_module, "MAX_ROUTES", 50)
    monkeypatch.setattr(route_module, "MAX_TOPICS", 50)
    p = pipeline()
    for i in range(200):
        p._route_for(f"type{i}".encode(), b"OrderPlaced", b"1")
    assert len(p._routes) <= 50
    assert len(p.router._topics) <= 50


def test_a_route_that_fails_is_not_kept():
    p = pipeline()
    for _ in range(3):
        with pytest.raises(InvalidTopicError):
            p._route_for(b"no such topic", b"OrderPlaced", b"1")
    assert p._routes == {}


def test_an_aggregate_type_outside_the_allow_list_is_the_events_fault():
    p = pipeline(aggregate_types=["order"])
    p._route_for(b"order", b"OrderPlaced", b"1")
    with pytest.raises(AggregateTypeNotAllowedError) as info:
        p._route_for(b"orderz", b"OrderPlaced", b"1")
    assert info.value.reason == "aggregate_type_not_allowed"
    assert list(p._routes) == [(b"order", b"OrderPlaced", b"1")]


def test_metric_series_per_topic_are_bounded(monkeypatch):
    monkeypatch.setattr(pipeline_module, "MAX_TOPIC_SERIES", 3)
    p = pipeline()
    series = {p._route_for(f"t{i}".encode(), b"OrderPlaced", b"1")[2] for i in range(10)}
    assert len(series) == 4 and pipeline_module.OTHER_TOPICS in series


def test_an_outbox_message_for_a_schema_with_a_decimal_hands_over_the_payload_as_written(tmp_path):
    """A message's payload is parsed with the message: for a decimal, its digits must come from its text."""
    (tmp_path / "Paid").mkdir()
    money = {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}
    schema = {"type": "record", "name": "Paid", "fields": [{"name": "amount", "type": money}]}
    (tmp_path / "Paid" / "v1.avsc").write_text(json.dumps(schema))
    p = pipeline(schemas_dir=str(tmp_path))
    emitted = []
    p._emit = emitted.append
    p._txn = object()  # inside a source transaction
    amount = b"1234567890123456789012345678.1234567891"
    for event_type in ("Paid", "OrderPlaced", "NoSuchSchema"):
        body = b'{"id": "e", "aggregate_type": "a", "aggregate_id": "x", "event_type": "%s", "payload": ' % (
            event_type.encode()
        )
        p._handle(LogicalMessage(True, 0, "outbox", body + b'{"amount": ' + amount + b"}}"))
    assert emitted[0][5] == b'{"amount": ' + amount + b"}"
    assert emitted[1][5] == emitted[2][5] == b'{"amount":1.2345678901234569e+27}', "others: orjson's float"

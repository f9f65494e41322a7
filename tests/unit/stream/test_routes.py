"""The routes part (cdc.stream.routes) at its own interface: what it keeps per free-text value of a row
(aggregate types, event types) is bounded, and a route that fails is never a failure of the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc.config_loader import load_settings
from cdc.errors import AggregateTypeNotAllowedError, InvalidTopicError
from cdc.stream import route as route_module
from cdc.stream import routes as routes_module
from cdc.stream.checkpoint import SourceTransaction
from cdc.stream.emit import Emitter
from cdc.stream.messages import LogicalMessage
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import EventRouter
from cdc.stream.routes import Routes

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


class _Sink:
    """Enough of KafkaSink for routing: every topic exists."""

    def ensure_topic(self, topic: str) -> None:
        pass

    def record_limit(self, topic: str) -> None:
        return None

    def produce(self, *args) -> None:
        raise AssertionError("nothing is produced here")


def settings(**overrides):
    return load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/db"},
        overrides={"schemas_dir": str(SCHEMAS), **overrides},
    )


def routes(sink=None, shrink=None, **overrides) -> Routes:
    s = settings(**overrides)

    def retrying(attempt, waits_on, on, recovered):
        return attempt()

    def no_shrink(topic: str, limit: int) -> None:
        raise AssertionError("no topic takes less here")

    return Routes(
        s,
        EventRouter(s),
        sink or _Sink(),  # type: ignore[arg-type]
        compiled=False,
        retrying=retrying,
        shrink_batches=shrink or no_shrink,
    )


def test_the_route_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(routes_module, "MAX_ROUTES", 50)
    monkeypatch.setattr(route_module, "MAX_TOPICS", 50)
    r = routes()
    for i in range(200):
        r.route(f"type{i}".encode(), b"OrderPlaced", b"1")
    assert len(r.cache) <= 50


def test_a_route_that_fails_is_not_kept():
    r = routes()
    for _ in range(3):
        with pytest.raises(InvalidTopicError):
            r.route(b"no such topic", b"OrderPlaced", b"1")
    assert r.cache == {}


def test_an_aggregate_type_outside_the_allow_list_is_the_events_fault():
    r = routes(aggregate_types=["order"])
    r.route(b"order", b"OrderPlaced", b"1")
    with pytest.raises(AggregateTypeNotAllowedError) as info:
        r.route(b"orderz", b"OrderPlaced", b"1")
    assert info.value.reason == "aggregate_type_not_allowed"
    assert list(r.cache) == [(b"order", b"OrderPlaced", b"1")]


def test_metric_series_per_topic_are_bounded(monkeypatch):
    monkeypatch.setattr(routes_module, "MAX_TOPIC_SERIES", 3)
    r = routes()
    series = {r.route(f"t{i}".encode(), b"OrderPlaced", b"1")[2] for i in range(10)}
    assert len(series) == 4 and routes_module.OTHER_TOPICS in series


def test_a_topic_that_takes_smaller_batches_asks_the_publisher_for_a_producer_that_fits():
    asked = []

    class Small(_Sink):
        def record_limit(self, topic: str) -> int:
            return 50_000

        def batches_fit(self, limit: int) -> bool:
            return False

    r = routes(Small(), lambda topic, limit: asked.append((topic, limit)))
    assert r.route(b"order", b"OrderPlaced", b"1")[3] == 50_000
    assert asked == [("outbox.event.order", 50_000)]


def test_an_outbox_message_for_a_schema_with_a_decimal_hands_over_the_payload_as_written(tmp_path):
    """A message's payload is parsed with the message: for a decimal, its digits must come from its text."""
    (tmp_path / "Paid").mkdir()
    money = {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}
    schema = {"type": "record", "name": "Paid", "fields": [{"name": "amount", "type": money}]}
    (tmp_path / "Paid" / "v1.avsc").write_text(json.dumps(schema))
    r = routes(schemas_dir=str(tmp_path))
    emitter = Emitter(
        EventRouter(settings()),
        r,
        _Sink(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        RefusalLedger(),
        SourceTransaction(),
        keep_alive=lambda: None,
        fail=lambda: None,  # type: ignore[arg-type,return-value]
        extra_headers=[],
    )
    emitted = []
    emitter.row = emitted.append  # type: ignore[method-assign]
    amount = b"1234567890123456789012345678.1234567891"
    for event_type in ("Paid", "OrderPlaced", "NoSuchSchema"):
        body = b'{"id": "e", "aggregate_type": "a", "aggregate_id": "x", "event_type": "%s", "payload": ' % (
            event_type.encode()
        )
        emitter.message(LogicalMessage(True, 0, "outbox", body + b'{"amount": ' + amount + b"}}"))
    assert emitted[0][5] == b'{"amount": ' + amount + b"}"
    assert emitted[1][5] == emitted[2][5] == b'{"amount":1.2345678901234569e+27}', "others: orjson's float"

from __future__ import annotations

import orjson
import pytest

from cdc.config_loader import load_settings
from cdc.errors import ConfigError, InvalidTopicError, MalformedEventError, ReservedTopicError
from cdc.stream.pgoutput import UNCHANGED_TOAST, Column, Relation
from cdc.stream.route import EventRouter, event_from_fields, template_clashes

DEFAULT_COLUMNS = [
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "schema_version",
    "payload",
    "headers",
    "created_at",
]


def router(*, compiled: bool = False, **overrides) -> EventRouter:
    settings = load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides=overrides
    )
    return EventRouter(settings, compiled=compiled)


def relation(names, *, oid=42, namespace="public", name="outbox") -> Relation:
    return Relation(oid, namespace, name, "d", tuple(Column(n, 25, -1, False) for n in names))


def row(**values):
    base = {
        "id": b"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "aggregate_type": b"order",
        "aggregate_id": b"o-1",
        "event_type": b"OrderPlaced",
        "schema_version": b"2",
        "payload": b'{"a": 1}',
        "headers": b'{"traceparent": "00-abc", "n": 3}',
        "created_at": b"2026-12-02 12:00:00+00",
    }
    base.update(values)
    return tuple(base[n] for n in DEFAULT_COLUMNS)


def from_row(r: EventRouter, values):
    return event_from_fields(r.row_fields(values))


def test_only_the_configured_table_is_the_outbox():
    r = router()
    assert not r.relation(relation(DEFAULT_COLUMNS, name="orders"))
    assert not r.relation(relation(DEFAULT_COLUMNS, namespace="other"))
    assert r.outbox_oid is None
    assert r.relation(relation(DEFAULT_COLUMNS, oid=77))
    assert r.outbox_oid == 77


def test_row_becomes_an_event_with_its_headers():
    r = router()
    r.relation(relation(DEFAULT_COLUMNS))
    event = from_row(r, row())
    assert event.id == "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    assert (event.aggregate_type, event.aggregate_id, event.event_type) == ("order", b"o-1", "OrderPlaced")
    assert event.schema_version == 2
    assert event.payload == b'{"a": 1}'
    assert event.headers == (("traceparent", b"00-abc"), ("n", b"3"))


def test_column_order_comes_from_the_relation_message():
    r = router()
    shuffled = list(reversed(DEFAULT_COLUMNS))
    r.relation(relation(shuffled))
    values = tuple(reversed(row(aggregate_id=b"o-9")))
    assert from_row(r, values).aggregate_id == b"o-9"


def test_debezium_preset_reads_debezium_columns_and_defaults_the_version():
    r = router(columns="debezium")
    r.relation(relation(["id", "aggregatetype", "aggregateid", "type", "payload"]))
    event = from_row(r, (b"e1", b"customer", b"c-1", b"CustomerRegistered", b"{}"))
    assert (event.id, event.aggregate_type, event.event_type, event.schema_version) == (
        "e1",
        "customer",
        "CustomerRegistered",
        1,
    )
    assert event.headers == ()


def test_a_mapped_column_missing_from_the_table_names_the_setting():
    r = router()
    with pytest.raises(ConfigError, match=r"no column 'headers'.*columns\.headers") as info:
        r.relation(relation([c for c in DEFAULT_COLUMNS if c != "headers"]))
    assert info.value.key == "columns.headers"


@pytest.mark.parametrize("column", ["id", "aggregate_type", "aggregate_id", "event_type", "payload"])
@pytest.mark.parametrize("value", [None, UNCHANGED_TOAST])
def test_null_required_column_is_malformed_and_named(column, value):
    r = router()
    r.relation(relation(DEFAULT_COLUMNS))
    with pytest.raises(MalformedEventError, match=column):
        from_row(r, row(**{column: value}))


def test_headers_that_are_not_an_object_are_ignored():
    r = router()
    r.relation(relation(DEFAULT_COLUMNS))
    assert from_row(r, row(headers=b"[1, 2]")).headers == ()
    assert from_row(r, row(headers=None)).headers == ()


def test_logical_message_becomes_an_event():
    body = {
        "id": "e-7",
        "aggregate_type": "order",
        "aggregate_id": "o-7",
        "event_type": "OrderShipped",
        "schema_version": 1,
        "payload": {"order_id": "o-7"},
        "headers": {"k": "v"},
    }
    fields = router().message_fields(orjson.dumps(body))
    assert fields[:5] == (b"e-7", b"order", b"o-7", b"OrderShipped", b"1")
    event = event_from_fields(fields)
    assert (event.id, event.aggregate_id, event.event_type) == ("e-7", b"o-7", "OrderShipped")
    assert orjson.loads(event.payload) == {"order_id": "o-7"}
    assert event.headers == (("k", b"v"),)


@pytest.mark.parametrize(
    ("content", "payload"),
    [
        (
            b'{"id": "e", "payload": {"amount": 12345678901234567890.1234567891}}',
            b'{"amount": 12345678901234567890.1234567891}',
        ),
        (b' {\n "payload" : 0.10 , "headers": {"payload": 1}, "x": [1, {"y": "}"}] } ', b"0.10"),
        (b'{"payload": {"a": "\\u00e9\\"}"}, "id": "\xc3\xa9"}', b'{"a": "\\u00e9\\"}"}'),
        (b'{"payload": {"a": 1}, "payload": {"a": 2.50}}', b'{"a": 2.50}'),  # the last, as orjson reads it
        (b'{"payload": []}', b"[]"),
    ],
)
def test_a_messages_payload_is_cut_out_as_written(content, payload):
    """message_fields writes the payload again from floats; a decimal needs the digits that were written."""
    assert router().exact_payload(content) == payload
    assert orjson.loads(router().exact_payload(content)) == orjson.loads(content)["payload"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"id": "e", "aggregate_type": "a", "event_type": "E", "payload": {}}', "lacks aggregate_id"),
        (b'{"id": 5, "aggregate_type": "a", "aggregate_id": "x", "event_type": "E", "payload": {}}', "id"),
        (
            b'{"id": "e", "aggregate_type": "a", "aggregate_id": "x", "event_type": "E", "payload": {},'
            b' "schema_version": "2"}',
            "schema_version",
        ),
    ],
)
def test_bad_logical_messages_are_malformed(content, message):
    with pytest.raises(MalformedEventError, match=message):
        router().message_fields(content)


def test_topic_template_uses_aggregate_and_event_type():
    r = router(topic_template="events.{aggregate_type}.{event_type}")
    assert r.topic("order", "OrderPlaced") == "events.order.OrderPlaced"
    assert r.topic("order", "OrderPlaced") == "events.order.OrderPlaced"
    assert r.topic("customer", "X") == "events.customer.X"


def test_a_rows_headers_cannot_take_the_name_of_a_system_header():
    """A row's {"id": "req-42"} must not become a second `id` header: a consumer that read it would take
    req-42 for the event id and, deduplicating on it, skip later real events."""
    r = router()
    r.relation(relation(DEFAULT_COLUMNS))
    raw = b'{"id": "req-42", "event_type": "x", "cdc_dlq_resolved": "0:1", "error_reason": "r", "n": 3}'
    event = from_row(r, row(headers=raw))
    assert event.headers == (
        ("row_id", b"req-42"),
        ("row_event_type", b"x"),
        ("row_cdc_dlq_resolved", b"0:1"),
        ("row_error_reason", b"r"),
        ("n", b"3"),
    )


@pytest.mark.parametrize("aggregate_type", ["order line", "x" * 300, "ordér", "a/b"])
def test_an_aggregate_type_that_makes_no_topic_name_is_the_events_fault(aggregate_type):
    r = router()
    with pytest.raises(InvalidTopicError) as info:
        r.topic(aggregate_type, "OrderPlaced")
    assert info.value.reason == "invalid_topic"
    assert len(str(info.value)) < 300, "the message quotes at most the start of a long name"


def test_a_failing_topic_is_not_cached_and_a_good_one_is():
    r = router()
    assert r.topic("order", "OrderPlaced") == r.topic("order", "OrderPlaced")
    for _ in range(3):
        with pytest.raises(InvalidTopicError):
            r.topic("order line", "OrderPlaced")
    assert list(r._topics) == [("order", "OrderPlaced")]


def test_an_event_with_undecodable_names_still_becomes_a_dead_letter_event():
    fields = (b"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", b"ord\xe9r", b"o-1", b"Order\xff", b"1", b"{}", None)
    event = event_from_fields(fields)
    assert event.aggregate_type == "ord\ufffdr" and event.event_type == "Order\ufffd"


def test_what_can_be_read_of_a_malformed_row_is_kept_for_its_dead_letter():
    r = router()
    r.relation(relation(DEFAULT_COLUMNS))
    values = row(aggregate_id=None)
    with pytest.raises(MalformedEventError):
        r.row_fields(values)
    assert r.salvage(values) == {
        "id": b"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "aggregate_type": b"order",
        "event_type": b"OrderPlaced",
        "schema_version": b"2",
        "payload": b'{"a": 1}',
        "headers": b'{"traceparent": "00-abc", "n": 3}',
    }
    assert router().salvage(values) == {}  # before the Relation message: nothing can be told apart


def test_what_can_be_read_of_a_malformed_message_is_kept_for_its_dead_letter():
    body = orjson.dumps({"id": "m-1", "aggregate_type": "order", "event_type": 7, "payload": {"a": 1}})
    assert router().salvage_message(body) == {
        "id": b"m-1",
        "aggregate_type": b"order",
        "payload": body,
    }
    assert router().salvage_message(b"not json") == {"payload": b"not json"}


def test_an_event_never_routes_into_a_topic_the_pipeline_or_kafka_owns():
    r = router(topic_template="app.{aggregate_type}", dlq_topic="app.dlq", checkpoint_topic="app.ckpt")
    assert r.topic("order", "OrderPlaced") == "app.order"
    for aggregate_type, what in (("dlq", "the dead-letter topic"), ("ckpt", "the exactly-once checkpoint")):
        with pytest.raises(ReservedTopicError, match=what) as caught:
            r.topic(aggregate_type, "OrderPlaced")
        assert caught.value.reason == "reserved_topic"
    bare = router(topic_template="{aggregate_type}")
    with pytest.raises(ReservedTopicError, match="Kafka's internal topics"):
        bare.topic("__consumer_offsets", "E")


def test_a_template_that_can_name_an_owned_topic_is_said_with_its_settings():
    clashing = load_settings(
        config_file=None,
        environ={"CDC_DATABASE_URL": "postgresql://u@h/d"},
        overrides={"topic_template": "app.{aggregate_type}", "dlq_topic": "app.dlq"},
    )
    (said,) = template_clashes(clashing)
    assert "topic_template = 'app.{aggregate_type}' can name the dead-letter topic" in said
    assert "dlq_topic = 'app.dlq'" in said
    default = load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/d"}, overrides={}
    )
    assert template_clashes(default) == []

"""From decoded changes to outbox events, and from events to topics.

Two things become events: an Insert into the configured outbox table (its columns found through the column
map, presets ``default`` and ``debezium``), and a transactional logical decoding message with the prefix
``outbox`` whose body is a JSON object with the same logical fields. Everything else on the stream (updates,
deletes and truncates of the outbox, other prefixes) is not an event.

Column values arrive as the text output of their types (bytes). The payload stays the bytes PostgreSQL sent
(``jsonb`` text output) and is parsed once, by the encoder. A message's payload is parsed with the message
and written again, which turns its numbers with a fraction into floats; for a schema with a decimal, read
from the digits written, :meth:`EventRouter.exact_payload` cuts the payload's own text out of the message.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson

from cdc import fastpath
from cdc.config import ColumnMap, Settings
from cdc.errors import ConfigError, InvalidTopicError, MalformedEventError, ReservedTopicError
from cdc.stream.pgoutput import UNCHANGED_TOAST, Relation, Values
from cdc.trace_context import properties_context

log = logging.getLogger("cdc.route")

MESSAGE_PREFIX = "outbox"
# What the pipeline caches per (aggregate type, event type, version): (topic, bound encoder, metric series,
# record limit); the series is the topic, or one for all past a bound; the limit is set when the topic takes
# less than the producer may send.
Route = tuple[str, Callable[[bytes], bytes], str, int | None]
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
MAX_TOPICS = 10_000  # the topic cache is keyed by the rows' free text: bounded
REQUIRED = ("id", "aggregate_type", "aggregate_id", "event_type", "payload")
_NAMES = ("id", "aggregate_type", "aggregate_id", "event_type")


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    id: str
    aggregate_type: str
    aggregate_id: bytes
    event_type: str
    schema_version: int
    payload: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


RowFields = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None]


class EventRouter:
    """Knows the outbox table's layout on the stream and the topic of each event."""

    def __init__(self, settings: Settings, *, compiled: bool = False) -> None:
        """``compiled``: :attr:`row_reader` reads outbox rows with the compiled extension
        (:mod:`cdc.fastpath`)."""
        self._columns: ColumnMap = settings.columns
        self._schema = settings.table.schema
        self._table = settings.table.name
        self._template = settings.topic_template
        self._owned = owned_topics(settings)
        self._topics: dict[tuple[str, str], str] = {}
        self.outbox_oid: int | None = None
        # Positions of the logical fields in the table's tuples, set by the Relation message.
        self._pos: tuple[int, ...] = ()
        self._required: Callable[[Values], Any] = _no_relation_yet
        self._pos_version: int | None = None
        self._pos_headers: int | None = None
        self._salvage: dict[str, int] = {}  # logical field -> position, for salvage()
        self._compiled = compiled and fastpath.extension is not None
        # The compiled decode_insert_tuple + row_fields of a whole XLogData message: the row's fields, or None
        # for anything it does not read (another table, a row row_fields refuses...): then the Python path.
        self.row_reader: Callable[[bytes], RowFields | None] | None = None

    def relation(self, rel: Relation) -> bool:
        """Learn a relation's layout. Returns whether it is the outbox table."""
        if rel.namespace != self._schema or rel.name != self._table:
            return False
        names = [c.name for c in rel.columns]
        mapping = self._columns.as_dict()

        def position(field: str) -> int | None:
            column = mapping[field]
            if column is None:
                return None
            try:
                return names.index(column)
            except ValueError:
                raise ConfigError(
                    f"the outbox table {rel.namespace}.{rel.name} has no column '{column}' for '{field}' "
                    f"(its columns: {', '.join(names)}); fix the 'columns' setting (columns.{field})",
                    key=f"columns.{field}",
                ) from None

        required = tuple(position(f) for f in REQUIRED)
        self._pos = tuple(p for p in required if p is not None)
        self._required = itemgetter(*self._pos)
        self._pos_version = position("schema_version")
        self._pos_headers = position("headers")
        span_context = self._columns.tracing_span_context
        if self._pos_headers is None and span_context in names:
            # Debezium's tracing column, when the table has one: parse_headers reads its Properties text.
            self._pos_headers = names.index(span_context)
        optional = {"schema_version": self._pos_version, "headers": self._pos_headers}
        self._salvage = {
            f: p for f, p in (*zip(REQUIRED, required, strict=True), *optional.items()) if p is not None
        }
        self.outbox_oid = rel.oid
        if self._compiled:
            assert fastpath.extension is not None
            self.row_reader = fastpath.extension.RowReader(
                rel.oid, self._pos, self._pos_version, self._pos_headers
            )
        return True

    def salvage(self, values: Values) -> dict[str, bytes]:
        """Whatever can be read of a row that is not a valid event, by logical field: its dead-letter record
        keeps it, for the outbox may be pruned by the time anyone looks."""
        out: dict[str, bytes] = {}
        for field, pos in self._salvage.items():
            value = values[pos] if pos < len(values) else None
            if isinstance(value, bytes):
                out[field] = value
        return out

    @staticmethod
    def salvage_message(content: bytes) -> dict[str, bytes]:
        """The same for an ``outbox`` logical message that is not a valid event: its text fields that are
        strings, and the whole body as its payload."""
        out: dict[str, bytes] = {}
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            out = {f: v.encode() for f in _NAMES if isinstance(v := body.get(f), str)}
        out["payload"] = content
        return out

    def row_fields(self, values: Values) -> RowFields:
        """The raw fields of one outbox Insert, as PostgreSQL sent them (text output, bytes):
        ``(id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers)``.

        The pipeline's hot path: no decoding to ``str``, no object per event. A missing schema_version
        column reads as ``b"1"``; ``headers`` is None when absent or null."""
        pv, ph = self._pos_version, self._pos_headers
        try:
            required = self._required(values)
            version = b"1" if pv is None else values[pv]
            headers = None if ph is None else values[ph]
        except IndexError:
            raise MalformedEventError("outbox row has fewer columns than its Relation message") from None
        # Text values are bytes; None is SQL NULL, UNCHANGED_TOAST a value the server did not send.
        if None in required or UNCHANGED_TOAST in required:
            raise MalformedEventError(_null_message(self._columns, values, self._pos))
        if type(version) is not bytes or not version.isdigit():
            raise MalformedEventError(
                f"outbox column '{self._columns.schema_version}' is null or not a number"
            )
        id_, aggregate_type, aggregate_id, event_type, payload = required
        return (
            id_,
            aggregate_type,
            aggregate_id,
            event_type,
            version,
            payload,
            headers if type(headers) is bytes else None,
        )  # the None and UNCHANGED_TOAST checks above leave bytes only

    def message_fields(self, content: bytes) -> RowFields:
        """The fields of a transactional logical message with the prefix ``outbox``, in the shape of
        :meth:`row_fields`: its body is a JSON object with id, aggregate_type, aggregate_id, event_type,
        payload, and optionally schema_version and headers."""
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise MalformedEventError("outbox logical message is not JSON") from None
        if not isinstance(body, dict):
            raise MalformedEventError("outbox logical message is not a JSON object")
        missing = [f for f in REQUIRED if body.get(f) is None]
        if missing:
            raise MalformedEventError(f"outbox logical message lacks {', '.join(missing)}")
        strings = {f: body[f] for f in ("id", "aggregate_type", "aggregate_id", "event_type")}
        wrong = [f for f, v in strings.items() if not isinstance(v, str)]
        if wrong:
            raise MalformedEventError(f"outbox logical message field(s) {', '.join(wrong)} must be strings")
        version = body.get("schema_version", 1)
        if type(version) is not int or version < 0:
            raise MalformedEventError("outbox logical message field schema_version must be an integer")
        headers = body.get("headers")
        return (
            strings["id"].encode(),
            strings["aggregate_type"].encode(),
            strings["aggregate_id"].encode(),
            strings["event_type"].encode(),
            str(version).encode(),
            orjson.dumps(body["payload"]),
            orjson.dumps(headers) if isinstance(headers, dict) else None,
        )

    @staticmethod
    def exact_payload(content: bytes) -> bytes:
        """The text of the ``payload`` of an outbox message that :meth:`message_fields` accepted, as written
        (the last one, as orjson reads duplicate keys)."""
        text, found = content.decode(), ""
        i = _skip_ws(text, 0) + 1  # past the "{" of the object message_fields checked
        while text[i := _skip_ws(text, i)] == '"':
            name, i = _scan_string(text, i + 1)
            start = _skip_ws(text, _skip_ws(text, i) + 1)  # past the ":"
            _, i = _scan_value(text, start)
            if name == "payload":
                found = text[start:i]
            if text[i := _skip_ws(text, i)] != ",":
                break  # the "}"
            i += 1
        return found.encode()

    def topic(self, aggregate_type: str, event_type: str) -> str:
        """The event's topic. Its names come from the row, so a name that makes no legal topic (a space,
        a '/', non-ASCII, over 249 characters) is the event's fault: InvalidTopicError, never cached."""
        key = (aggregate_type, event_type)
        topic = self._topics.get(key)
        if topic is None:
            topic = self._template.format(aggregate_type=aggregate_type, event_type=event_type)
            if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
                raise InvalidTopicError(
                    f"aggregate type {_shown(aggregate_type)} and event type {_shown(event_type)} make the "
                    f"topic name {_shown(topic)}, which Kafka does not accept ([A-Za-z0-9._-], 1 to 249)"
                )
            if topic in self._owned or topic.startswith(KAFKA_INTERNAL_PREFIX):
                raise ReservedTopicError(
                    f"aggregate type {_shown(aggregate_type)} and event type {_shown(event_type)} make the "
                    f"topic name {_shown(topic)}, which is "
                    + ("one of Kafka's internal topics" if topic not in self._owned else self._owned[topic])
                    + ": a row never writes into it"
                )
            topics = self._topics
            if len(topics) >= MAX_TOPICS:
                del topics[next(iter(topics))]
            topics[key] = topic
        return topic


_WS = re.compile(r"[ \t\n\r]*")
_scan_string = json.decoder.scanstring  # type: ignore[attr-defined]
_scan_value = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by its __init__


def _skip_ws(text: str, i: int) -> int:
    match = _WS.match(text, i)
    assert match is not None  # it matches the empty string
    return match.end()


KAFKA_INTERNAL_PREFIX = "__"  # __consumer_offsets, __transaction_state, ...


def owned_topics(settings: Settings) -> dict[str, str]:
    """The topics the pipeline writes for itself, each with what it is: no event may be routed there."""
    return {
        settings.dlq_topic: f"the dead-letter topic (dlq_topic = {settings.dlq_topic!r})",
        settings.checkpoint_topic: (
            f"the exactly-once checkpoint topic (checkpoint_topic = {settings.checkpoint_topic!r})"
        ),
    }


def template_clashes(settings: Settings) -> list[str]:
    """Why ``topic_template`` can make the name of a topic the pipeline owns (empty when it cannot): said at
    start, since such events are dead-lettered (reserved_topic) rather than published."""
    pattern = "".join(
        "[A-Za-z0-9._-]*" if part in ("{aggregate_type}", "{event_type}") else re.escape(part)
        for part in re.split(r"(\{aggregate_type\}|\{event_type\})", settings.topic_template)
    )
    return [
        f"topic_template = {settings.topic_template!r} can name {what}: events routed there are "
        "dead-lettered (reserved_topic); give it a name the template cannot make, or narrow the template"
        for topic, what in owned_topics(settings).items()
        if re.fullmatch(pattern, topic)
    ]


def _shown(name: str) -> str:
    """A name from a row, quoted for a message and cut short: it may be anything, of any length."""
    return repr(name if len(name) <= 60 else name[:57] + "...")


def _no_relation_yet(values: Values) -> Any:
    raise MalformedEventError("an outbox row arrived before its table's Relation message")


def event_from_fields(fields: RowFields) -> OutboxEvent:
    id_, aggregate_type, aggregate_id, event_type, version, payload, headers = fields
    # For the dead-letter path too: a name that is not UTF-8 is shown with replacement characters.
    return OutboxEvent(
        id_.decode(errors="replace"),
        aggregate_type.decode(errors="replace"),
        aggregate_id,
        event_type.decode(errors="replace"),
        int(version),
        payload,
        parse_headers(headers) if headers is not None else (),
    )


def parse_headers(raw: bytes) -> tuple[tuple[str, bytes], ...]:
    """The row's ``headers`` jsonb as Kafka headers, or the ``traceparent`` and ``tracestate`` of Debezium's
    ``tracingspancontext`` text. Anything else is ignored with a warning: headers are metadata, and a bad
    one must not hold the event back."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        context = properties_context(raw)
        if not context:
            log.warning("outbox headers column is not JSON; headers ignored")
        return context
    if not isinstance(data, dict):
        log.warning("outbox headers column is not a JSON object; headers ignored")
        return ()
    return header_pairs(data)


# Header names the pipeline and its tools write themselves. A row's own header of such a name is kept as
# ``row_<name>``: consumers read the first header of a name, but a second ``id`` is a trap for any reader
# that keeps the last, and a deduplicating consumer that took a row's "req-42" for the event id would skip
# every later event that carries it.
SYSTEM_HEADERS = frozenset(
    {"id", "event_type", "schema_version", "aggregate_type", "commit_lsn", "xid"}
    | {"error_class", "error_reason", "error_message", "original_topic", "commit_time"}
)
ROW_HEADER_PREFIX = "row_"


def header_pairs(data: dict[str, Any]) -> tuple[tuple[str, bytes], ...]:
    return tuple(
        (_row_header_name(str(k)), v.encode() if isinstance(v, str) else orjson.dumps(v))
        for k, v in data.items()
        if v is not None
    )


def _row_header_name(name: str) -> str:
    reserved = name in SYSTEM_HEADERS or name.startswith("cdc_")
    return ROW_HEADER_PREFIX + name if reserved else name


def _null_message(columns: ColumnMap, values: Values, positions: tuple[int, ...]) -> str:
    nulls = [
        columns.as_dict()[field] or field
        for field, pos in zip(REQUIRED, positions, strict=True)
        if type(values[pos]) is not bytes
    ]
    return f"outbox row has null or unsent value(s) in column(s) {', '.join(map(str, nulls))}"

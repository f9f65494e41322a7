"""Fakes for the consumer's parts, each shaped like what the part sees of the real thing: a Kafka record, the
librdkafka consumer and producer, the service's PostgreSQL connection (over an in-memory guard table), and a
deserializer. The real services run in tests/integration/consumer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException

from cdc.avro.deserialize import Event
from cdc.errors import DeserializationError

TOPIC = "outbox.event.order"
GARBAGE = b"not avro"  # the value decode() refuses


class Record:
    """A Kafka record as librdkafka hands it over, with an ``id`` header (none when ``event_id`` is None)."""

    def __init__(
        self,
        event_id: str | None,
        offset: int = 0,
        partition: int = 0,
        value: bytes | None = b"order",
        key: bytes | None = b"o-1",
        error: Any = None,
    ) -> None:
        self.event_id, self._offset, self._partition = event_id, offset, partition
        self._value, self._key, self._error = value, key, error

    def __repr__(self) -> str:
        return f"Record({self.event_id!r}, [{self._partition}]@{self._offset})"

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]]:
        return [] if self.event_id is None else [("id", self.event_id.encode())]

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def error(self) -> Any:
        return self._error


def records(*ids: str | None, partition: int = 0) -> list[Record]:
    """Records of one partition at offsets 0, 1, ...; an id ``garbage-*`` has a value decode() refuses."""
    return [
        Record(i, offset=n, partition=partition, value=GARBAGE if i and i.startswith("garbage") else b"order")
        for n, i in enumerate(ids)
    ]


def decode(message: Any) -> Event:
    """The deserializer: the event of a record (its id is the ``id`` header's), or DeserializationError."""
    if message.value() == GARBAGE:
        raise DeserializationError(f"{message.topic()}[0]@0: not Avro")
    headers = {k: (v or b"").decode() for k, v in message.headers()}
    return Event(
        id=headers.get("id", ""),
        event_type="OrderPlaced",
        schema_version=1,
        read_version=1,
        payload={},
        headers=headers,
        key=None,
        topic=TOPIC,
    )


class _Cursor:
    def __init__(self, rowcount: int = -1, rows: list[tuple[str]] | None = None) -> None:
        self.rowcount, self._rows = rowcount, rows or []

    def fetchall(self) -> list[tuple[str]]:
        return self._rows


class _Pipeline:
    def __init__(self, conn: FakeConnection) -> None:
        self._conn = conn

    def sync(self) -> None:
        if self._conn.failed:
            raise psycopg.errors.InFailedSqlTransaction("current transaction is aborted")


@dataclass
class FakeConnection:
    """psycopg's Connection as the consumer uses it: ``transaction()`` keeps what it wrote (guard rows, and
    the handlers' ``execute("effect", (id,))``) when it ends cleanly, drops it when it raises; the guard
    statements answer as PostgreSQL's ``INSERT ... ON CONFLICT DO NOTHING`` does. A handler's
    ``execute("fail")`` is a statement that fails: in pipeline mode its error surfaces at the next
    ``execute``, as psycopg's does."""

    guard: set[str] = field(default_factory=set)  # committed guard rows (event ids)
    effects: list[str] = field(default_factory=list)  # committed effects
    commits: int = 0
    rollbacks: int = 0
    pipelines: int = 0  # pipeline() blocks entered
    failed: bool = False  # a statement of the open transaction failed
    _written: tuple[set[str], list[str]] | None = None
    _pipelined: bool = False
    _deferred: Exception | None = None

    @property
    def info(self) -> Any:
        status = psycopg.pq.TransactionStatus
        return type("Info", (), {"transaction_status": status.INERROR if self.failed else status.INTRANS})

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        assert self._written is None, "transactions do not nest here"
        self._written, self.failed = (set(), []), False
        try:
            yield
            if self.failed:
                raise psycopg.errors.InFailedSqlTransaction("current transaction is aborted")
        except BaseException:
            self.rollbacks += 1
            raise
        else:
            guard, effects = self._written
            self.guard |= guard
            self.effects += effects
            self.commits += 1
        finally:
            self._written, self._deferred = None, None

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[_Pipeline]:
        self.pipelines += 1
        self._pipelined = True
        try:
            yield _Pipeline(self)
        finally:
            self._pipelined = False

    def execute(self, query: str, params: Any = ()) -> _Cursor:
        assert self._written is not None, "outside a transaction"
        if self._deferred is not None:  # an earlier statement's error, surfacing here
            error, self._deferred = self._deferred, None
            raise error
        guard, effects = self._written
        if "json_array_elements_text" in query:  # mark_many: the new ids
            new = []
            for event_id in json.loads(params[1]):
                if event_id not in self.guard and event_id not in guard:
                    guard.add(event_id)
                    new.append((event_id,))
            return _Cursor(rows=new)
        if query.startswith("INSERT INTO"):  # mark_processed: one id
            event_id = params[0]
            if event_id in self.guard or event_id in guard:
                return _Cursor(rowcount=0)
            guard.add(event_id)
            return _Cursor(rowcount=1)
        if query == "fail":
            self.failed = True
            error = psycopg.errors.DivisionByZero("division by zero")
            if self._pipelined:
                self._deferred = error
                return _Cursor()
            raise error
        assert query == "effect", query
        effects.append(params[0])
        return _Cursor()


@dataclass
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + sum(len(k) + len(v) for k, v in self.headers)


@dataclass
class FakeProducer:
    """Refuses a record above ``limit`` bytes as librdkafka does: at produce() (its own message.max.bytes)
    or, with ``broker=True``, in the delivery report (the topic's max.message.bytes)."""

    limit: int = 1_000_000
    broker: bool = False
    topics: tuple[str, ...] = ("inv.dlq",)
    sent: list[Sent] = field(default_factory=list)  # delivered
    refused: list[Sent] = field(default_factory=list)
    conf: dict[str, Any] = field(default_factory=dict)
    _reports: list[Any] = field(default_factory=list)

    def __call__(self, conf: dict[str, Any]) -> FakeProducer:  # as confluent_kafka.Producer(conf)
        self.conf = conf
        return self

    def list_topics(self, timeout: float) -> Any:
        return type("Metadata", (), {"topics": dict.fromkeys(self.topics)})

    def produce(
        self, topic: str, *, key: Any, value: Any, headers: Any, timestamp: int, on_delivery: Any
    ) -> None:
        record = Sent(topic, key, value, list(headers))
        too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if record.size() > self.limit else None
        if too_large is not None and not self.broker:
            self.refused.append(record)
            raise KafkaException(too_large)
        (self.refused if too_large else self.sent).append(record)
        self._reports.append(lambda: on_delivery(too_large, None))

    def flush(self, timeout: float) -> int:
        while self._reports:
            self._reports.pop(0)()
        return 0

"""`cdc outbox republish`: outbox rows published again from the table, through the pipeline's own code.

For a backfill, a new consumer that needs history, and `cdc recover` (:mod:`cdc.ops.recover`). The rows are
read in one snapshot (REPEATABLE READ, a server-side cursor), each column as its text output, which is what
pgoutput sends for an insert; then they go through the pipeline's own route, encode, produce and dead-letter
parts (:mod:`cdc.stream.emit` and what it is given), so a republished event is the record `cdc run` would
have made: the same id, key, topic, value and headers, with the header ``cdc_republished`` added. Only the
Kafka timestamp differs: the commit time is not in the table, so the row's ``created_at`` stands for it (the
time the application wrote the row, a little before its commit).

Order: by ``created_at``, then the order the rows are stored in. The rows of one transaction share their
``created_at`` (``now()`` is the transaction's start), so storage order keeps them in insert order on an
insert-only table; across transactions, creation order stands in for commit order. Each copy is a duplicate
of an event that consumers may have seen, and they drop it by id (``IdempotentConsumer``).

Delivery is at-least-once whatever ``delivery`` says: a transactional producer with the slot's
transactional id would fence the running pipeline. Rows go in batches of ``BATCH_ROWS``; each batch is
acknowledged by Kafka before the next is read, so a batch whose records Kafka refuses is sent again with
the refused records alone, and the one Kafka refuses alone is dead-lettered, as `cdc run` does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc import fastpath
from cdc.config import Settings, created_at_missing
from cdc.errors import DeliveryRefusedError, RecoveryError
from cdc.pg import database_dsn
from cdc.stream.checkpoint import Acks, SourceTransaction
from cdc.stream.deadletters import DeadLetters
from cdc.stream.emit import Emitter
from cdc.stream.failures import DeliveryFailures
from cdc.stream.life import Life, Streaming
from cdc.stream.messages import Column, Relation
from cdc.stream.publisher import AtLeastOnce
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import EventRouter
from cdc.stream.routes import Routes
from cdc.stream.sender import Sender
from cdc.stream.sink import Headers, KafkaSink
from cdc.stream.waits import Waits

__all__ = ["REPUBLISHED_HEADER", "Republisher", "RowFilter", "count_rows", "republish", "select_rows"]

log = logging.getLogger("cdc.republish")

REPUBLISHED_HEADER = "cdc_republished"
BATCH_ROWS = 2000
MAX_REPLAYS_PER_BATCH = 20
_FIELDS = ("id", "aggregate_type", "aggregate_id", "event_type", "schema_version", "payload", "headers")

Progress = Callable[[int], None]  # called with the number of rows Kafka acknowledged since the last call


@dataclass(frozen=True, kw_only=True)
class RowFilter:
    """Which rows: created in [since, until), of these aggregate types, event types and ids (each optional;
    several values of one kind are alternatives); and, for `cdc recover`, committed since ``committed_since``
    by their inserting transaction's commit timestamp (``track_commit_timestamp``; a row without one, from
    before the setting was on or frozen long ago, by its creation time, or chosen when there is none)."""

    committed_since: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None
    aggregate_types: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.committed_since
            or self.since
            or self.until
            or self.aggregate_types
            or self.event_types
            or self.ids
        )


@dataclass
class RepublishResult:
    rows: int = 0
    published: int = 0
    dead_lettered: int = 0
    first_created: datetime | None = None
    last_created: datetime | None = None


def _where(settings: Settings, rows: RowFilter) -> tuple[sql.Composable, list[Any]]:
    cols = settings.columns
    conditions: list[sql.Composable] = []
    params: list[Any] = []
    if rows.committed_since is not None:
        if cols.created_at is None:
            fallback: sql.Composable = sql.SQL("true")
        else:
            fallback = sql.SQL("{} >= %s").format(sql.Identifier(cols.created_at))
        conditions.append(sql.SQL("coalesce(pg_xact_commit_timestamp(xmin) >= %s, {})").format(fallback))
        params += [rows.committed_since] * (1 if cols.created_at is None else 2)
    if rows.since is not None or rows.until is not None:
        if cols.created_at is None:
            raise created_at_missing(
                settings,
                "choosing rows by --since or --until",
                "; or choose rows by --id, --aggregate-type or --event-type",
            )
        created = sql.Identifier(cols.created_at)
        if rows.since is not None:
            conditions.append(sql.SQL("{} >= %s").format(created))
            params.append(rows.since)
        if rows.until is not None:
            conditions.append(sql.SQL("{} < %s").format(created))
            params.append(rows.until)
    for column, values in (
        (cols.aggregate_type, rows.aggregate_types),
        (cols.event_type, rows.event_types),
        (cols.id, rows.ids),
    ):
        if values:
            conditions.append(sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(column)))
            params.append(list(values))
    where = sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("true")
    return where, params


def _table(settings: Settings) -> sql.Identifier:
    return sql.Identifier(settings.table.schema, settings.table.name)


def count_rows(conn: psycopg.Connection[Any], settings: Settings, rows: RowFilter) -> RepublishResult:
    """How many rows the filter chooses, and their creation times (the dry run)."""
    where, params = _where(settings, rows)
    created = settings.columns.created_at
    span = (
        sql.SQL("min({c}), max({c})").format(c=sql.Identifier(created)) if created else sql.SQL("NULL, NULL")
    )
    query = sql.SQL("SELECT count(*), {span} FROM {table} WHERE {where}").format(
        span=span, table=_table(settings), where=where
    )
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return RepublishResult(rows=int(row[0]), first_created=row[1], last_created=row[2])


def select_rows(
    conn: psycopg.Connection[Any], settings: Settings, rows: RowFilter, *, fetch: int = BATCH_ROWS
) -> tuple[Relation, Iterator[tuple[tuple[bytes | None, ...], int, bytes]]]:
    """The rows the filter chooses, in republish order, on a server-side cursor of ``conn`` (which must be in
    a transaction): the Relation the router learns their layout from, and per row (the values as pgoutput
    sends them, the Kafka timestamp in ms, the inserting transaction's id)."""
    mapping = settings.columns.as_dict()
    present = [(f, mapping[f]) for f in _FIELDS if mapping.get(f) is not None]
    found = conn.execute("SELECT %s::regclass::oid", (f"{_table(settings).as_string(conn)}",)).fetchone()
    assert found is not None
    relation = Relation(
        oid=int(found[0]),
        namespace=settings.table.schema,
        name=settings.table.name,
        replica_identity="d",
        columns=tuple(Column(str(column), 25, -1, field == "id") for field, column in present),
    )
    created = settings.columns.created_at
    # Floored, as cdc run floors the commit time: a bigint cast rounds, and stamped a copy after its original.
    timestamp = sql.SQL("floor(extract(epoch FROM {})*1000)::bigint").format(
        sql.Identifier(created) if created else sql.SQL("now()")
    )
    order = sql.SQL("{}, ctid").format(sql.Identifier(created)) if created else sql.SQL("ctid")
    where, params = _where(settings, rows)
    query = sql.SQL("SELECT {cols}, {ts}, xmin::text FROM {table} WHERE {where} ORDER BY {order}").format(
        cols=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(str(c))) for _, c in present),
        ts=timestamp,
        table=_table(settings),
        where=where,
        order=order,
    )
    width = len(present)

    def generate() -> Iterator[tuple[tuple[bytes | None, ...], int, bytes]]:
        with conn.cursor(name="cdc_republish") as cursor:
            cursor.itersize = fetch
            cursor.execute(query, params)
            for row in cursor:
                values = tuple(None if v is None else v.encode() for v in row[:width])
                yield values, int(row[width]), row[width + 1].encode()

    return relation, generate()


class Republisher:
    """The pipeline's route, encode, produce and dead-letter parts (:mod:`cdc.stream`), fed with outbox rows
    from the table, not the slot: at-least-once, each batch acknowledged before the next is read."""

    def __init__(self, settings: Settings, *, mark: str) -> None:
        self.settings = s = replace(settings, delivery="at-least-once")
        compiled = fastpath.enabled(s.fast_path)
        self._sink = sink = KafkaSink(s)
        self._acks = acks = Acks()
        self._life = life = Life()
        self._refusals = refusals = RefusalLedger()
        current = SourceTransaction()
        self._failures = failures = DeliveryFailures(s, sink, acks)
        self._router = router = EventRouter(s, compiled=compiled)
        self._waits = waits = Waits(
            settings=s,
            sink=sink,
            life=life,
            keep_alive=failures.check,  # no slot to keep alive
            check=failures.check,
            acked_events=lambda: acks.tracker.acked_events,
        )
        publisher = AtLeastOnce(sink, waits.until_empty)
        self._routes = routes = Routes(
            s,
            router,
            sink,
            compiled=compiled,
            retrying=waits.retrying,
            shrink_batches=publisher.shrink_batches,
        )
        self._sender = sender = Sender(
            sink,
            refusals,
            current,
            until_empty=waits.until_empty,
            keep_alive=failures.check,
            fail=failures.fail,
        )
        headers: Headers = [(REPUBLISHED_HEADER, mark.encode())]
        self._dead_letters = dead_letters = DeadLetters(
            s, sink, sender, current, ensure_topic=routes.ensure_topic, extra_headers=headers, trace=False
        )
        self._emitter = Emitter(
            router,
            routes,
            sink,
            sender,
            dead_letters,
            refusals,
            current,
            keep_alive=failures.check,
            fail=failures.fail,
            extra_headers=headers,
        )
        self._position_seq = 0  # rows handed over so far: the positions of the ack bookkeeping
        self.replays = 0

    @property
    def events_published(self) -> int:
        return sum(self._routes.published.values())

    @property
    def events_dead_lettered(self) -> int:
        return self._dead_letters.total

    def start(self) -> None:
        self._sink.check_broker(self.settings.startup_timeout)
        self._life.to(Streaming(time.monotonic()))

    def publish(
        self,
        relation: Relation,
        rows: Iterator[tuple[tuple[bytes | None, ...], int, bytes]],
        *,
        progress: Progress | None = None,
    ) -> int:
        """Publish every row; returns how many. Each batch is acknowledged before the next is read."""
        if not self._router.relation(relation):
            raise RecoveryError(f"{relation.namespace}.{relation.name} is not the configured outbox table")
        total = 0
        batch: list[tuple[tuple[bytes | None, ...], int, bytes]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                self._publish_batch(batch, progress)
                total += len(batch)
                batch = []
        if batch:
            self._publish_batch(batch, progress)
            total += len(batch)
        return total

    def _publish_batch(
        self, batch: Sequence[tuple[tuple[bytes | None, ...], int, bytes]], progress: Progress | None
    ) -> None:
        start = self._position_seq
        end = start + len(batch)
        emitter = self._emitter
        for attempt in range(MAX_REPLAYS_PER_BATCH + 1):
            tracker = self._acks.restart(start)
            try:
                txn = tracker.begin(0, end, time.time_ns() // 1000)
                for values, ts_ms, xid in batch:
                    emitter.begin(txn, b"", xid, ts_ms)
                    emitter.insert(values)
                emitter.end()
                tracker.commit(txn, end)
                self._waits.until_empty()
                if tracker.confirmed_lsn != end:
                    raise RecoveryError("Kafka did not acknowledge every republished record")
                break
            except DeliveryRefusedError as exc:
                if attempt == MAX_REPLAYS_PER_BATCH:
                    raise RecoveryError(f"Kafka keeps refusing records of a batch: {exc}") from exc
                self._refusals.note(exc.refused, alone=self._sender.alone, at=start, until=end)
                self._sender.alone = None
                emitter.end()
                self._sink.reset()
                self._routes.forget()  # topic limits are read again
                self.replays += 1
                log.warning("%s; sending the batch again, the refused records one at a time", exc)
        self._refusals.settled(end)
        self._position_seq = end
        if progress is not None:
            progress(len(batch))

    def close(self) -> None:
        """Wait (bounded) for what is in flight; nothing is confirmed anywhere, so there is nothing else."""
        left = self._sink.flush(self.settings.shutdown_timeout)
        if left:
            log.warning("%d republished records not acknowledged within shutdown_timeout", left)
        if self._routes.registry is not None:
            self._routes.registry.close()


def republish(
    settings: Settings,
    rows: RowFilter,
    *,
    mark: str,
    progress: Progress | None = None,
    conn: psycopg.Connection[Any] | None = None,
) -> RepublishResult:
    """Republish the rows ``rows`` chooses. ``conn`` (in a transaction, in the snapshot to read) is
    `cdc recover`'s; without it, a REPEATABLE READ transaction of its own."""
    own = conn is None
    if conn is None:
        from cdc.pg import connect

        conn = connect(database_dsn(settings))
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        result = count_rows(conn, settings, rows)
        republisher = Republisher(settings, mark=mark)
        try:
            republisher.start()
            relation, chosen = select_rows(conn, settings, rows)
            result.rows = republisher.publish(relation, chosen, progress=progress)
        finally:
            republisher.close()
        result.published = republisher.events_published
        result.dead_lettered = republisher.events_dead_lettered
        return result
    finally:
        if own:
            conn.close()

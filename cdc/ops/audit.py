"""`cdc audit`: the outbox table against what Kafka holds, so that "nothing lost" is shown in production.

The outbox table holds every committed event for as long as it is kept; Kafka holds what was published and
what was dead-lettered. The audit takes the rows created in a window, reads the topics they route to and the
dead-letter topic (:mod:`cdc.ops.audit_read`), streams the ids it finds into a temporary table with COPY,
and compares the two with one query, so that its memory does not grow with the window. Each row of the
window is, by precedence:

- **replayed**: dead-lettered, then published by `cdc dlq replay` (counted once, not as a duplicate);
- **published**: in its topic (a copy from `cdc outbox republish` or `cdc recover` counts);
- **discarded**: dead-lettered, then discarded with `cdc dlq discard`;
- **dead-lettered**: in the dead-letter topic, unresolved;
- **missing**: in neither. Exit 1.

Copies of an event beyond the first in its topics are **duplicates** (at-least-once delivery allows them).
Records read with ``read_committed``: an aborted exactly-once record does not count. A row whose transaction
rolled back is not in the table, so it is never expected. An event emitted as a logical message
(``outbox_emit_message``) leaves no row: the audit counts the window's records whose id has no row and says
it cannot check them.

Rows created before the window whose transactions were open during the last clean audit (which could not
see them) are judged too, and a clean audit moves the mark that `cdc outbox prune --audited` trusts
(:mod:`cdc.ops.audit_mark`).

It refuses (exit 2) a window it cannot judge: rows of it were pruned (``cdc_checkpoint.pruned_until``),
retention deleted records of it, or it ends after the slot's acknowledged position, where events may still be
in flight. That position is the commit time of the last outbox transaction Kafka acknowledged, which `cdc
run` saves (:mod:`cdc.stream.progress`); rows are chosen by their transaction's commit timestamp when the
server keeps them (``track_commit_timestamp``), else by ``created_at`` and the window must end ``margin``
before that position (a transaction longer than the margin could still be in flight).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings, created_at_missing
from cdc.errors import (
    AuditError,
    AuditRefusedError,
    InvalidTopicError,
    SourceConnectionError,
    first_line,
)
from cdc.ops import audit_mark
from cdc.ops.audit_read import TopicReader, copy_rows, dead_letter_row, event_row
from cdc.pg import connect, database_dsn, tracks_commit_timestamps
from cdc.stream.progress import read_position
from cdc.stream.route import EventRouter

log = logging.getLogger("cdc.audit")

DEFAULT_MARGIN = timedelta(minutes=5)
STATES = ("published", "replayed", "discarded", "dead_lettered", "missing")


@dataclass(frozen=True, kw_only=True)
class Window:
    since: datetime
    until: datetime
    by_commit: bool  # rows chosen by their commit timestamp (and the acknowledged one), else created_at
    acknowledged: datetime  # the commit time of the last outbox transaction Kafka acknowledged


@dataclass
class AggregateCounts:
    expected: int = 0
    published: int = 0
    replayed: int = 0
    discarded: int = 0
    dead_lettered: int = 0
    missing: int = 0
    duplicates: int = 0


@dataclass
class AuditReport:
    window: Window
    aggregates: dict[str, AggregateCounts] = field(default_factory=dict)
    missing_ids: list[str] = field(default_factory=list)  # the first ones, or every one
    without_row: int = 0  # records of the window whose id has no row: logical messages, or rows deleted
    audited_until: datetime | None = None  # cdc_checkpoint's, after this audit
    topics: list[str] = field(default_factory=list)
    filtered: bool = False  # --aggregate-type: some rows were not judged
    carried: int = 0  # rows created before the window that an earlier audit could not see, judged now

    @property
    def missing(self) -> int:
        return sum(a.missing for a in self.aggregates.values())


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def plan(
    conn: psycopg.Connection[Any],
    settings: Settings,
    *,
    since: datetime,
    until: datetime | None,
    margin: timedelta,
) -> Window:
    """The window to judge, or the refusal that says which bound to move."""
    if settings.columns.created_at is None:
        raise created_at_missing(settings, "`cdc audit`, which chooses rows by their creation time,")
    saved = read_position(conn, settings)
    if saved is None or saved.commit_time is None:
        raise AuditRefusedError(
            f"slot '{settings.slot}' has no acknowledged position in cdc_checkpoint yet (cdc run saves it "
            "once Kafka acknowledged an outbox transaction): run the audit after `cdc run` published"
        )
    by_commit = tracks_commit_timestamps(conn)
    acknowledged = saved.commit_time
    latest = acknowledged if by_commit else acknowledged - margin
    if until is None:
        until = latest
    elif until > latest:
        why = "" if by_commit else f" minus --margin {margin} (rows are chosen by created_at)"
        raise AuditRefusedError(
            f"the window ends at {_iso(until)}, after the slot's acknowledged position ({_iso(acknowledged)}"
            f"{why}): events after it may still be in flight. Use --until {_iso(latest)} or earlier"
        )
    if since >= until:
        raise AuditRefusedError(
            f"the window [{_iso(since)}, {_iso(until)}) is empty: --since must be before --until (the "
            f"default --until is the slot's acknowledged position, {_iso(latest)})"
        )
    if saved.pruned_until is not None and since <= saved.pruned_until:
        raise AuditRefusedError(
            f"rows created up to {_iso(saved.pruned_until)} were pruned (cdc outbox prune), which the "
            f"window starting {_iso(since)} needs: audit from --since "
            f"{_iso(saved.pruned_until + timedelta(seconds=1))} or later"
        )
    return Window(since=since, until=until, by_commit=by_commit, acknowledged=acknowledged)


def _expected(
    conn: psycopg.Connection[Any],
    settings: Settings,
    window: Window,
    aggregate_types: tuple[str, ...],
    scope: audit_mark.Scope,
) -> Chosen:
    """The rows to judge, into ``audit_expected``: the window's, and those earlier audits did not see (the
    scope's carried rows). Run in the scope's snapshot."""
    cols = settings.columns
    created = sql.Identifier(cols.created_at or "created_at")
    chosen: sql.Composable = sql.SQL("({} >= %s AND {} < %s)").format(created, created)
    params: list[Any] = [window.since, window.until]
    carried = scope.carried(created, window.since)
    if carried is not None:
        chosen = sql.SQL("({} OR {})").format(chosen, carried[0])
        params += carried[1]
    # A row of a transaction that committed after the acknowledged one may still be in flight: chosen, noted
    # (it stops the mark), then set aside.
    late: sql.Composable = sql.SQL("false")
    if window.by_commit:
        late = sql.SQL("coalesce(pg_xact_commit_timestamp(xmin) > %s, false)")
    conditions: list[sql.Composable] = [chosen]
    if aggregate_types:
        conditions.append(sql.SQL("{}::text = ANY(%s)").format(sql.Identifier(cols.aggregate_type)))
        params.append(list(aggregate_types))
    conn.execute(
        sql.SQL(
            "CREATE TEMP TABLE audit_expected AS SELECT {}::text AS id, {}::text AS aggregate_type, "
            "{}::text AS event_type, {} AS created_at, {} AS late FROM {} WHERE {}"
        ).format(
            sql.Identifier(cols.id),
            sql.Identifier(cols.aggregate_type),
            sql.Identifier(cols.event_type),
            created,
            late,
            sql.Identifier(settings.table.schema, settings.table.name),
            sql.SQL(" AND ").join(conditions),
        ),
        [window.acknowledged, *params] if window.by_commit else params,
    )
    row = conn.execute(
        "SELECT min(created_at) FILTER (WHERE late), min(created_at), "
        "count(*) FILTER (WHERE created_at < %s AND NOT late) FROM audit_expected",
        (window.since,),
    ).fetchone()
    assert row is not None
    conn.execute("DELETE FROM audit_expected WHERE late")
    conn.execute("CREATE INDEX ON audit_expected (id)")
    oldest = window.since if row[1] is None else min(window.since, row[1])
    return Chosen(late=row[0], oldest=oldest, carried=int(row[2]))


@dataclass(frozen=True, kw_only=True)
class Chosen:
    late: datetime | None  # the oldest row set aside as still in flight
    oldest: (
        datetime  # the window's start, or the oldest carried row's creation: the topics' read starts there
    )
    carried: int  # rows of earlier windows judged now


def _topics(conn: psycopg.Connection[Any], settings: Settings) -> list[str]:
    router = EventRouter(settings)
    topics = set()
    for aggregate_type, event_type in conn.execute(
        "SELECT DISTINCT aggregate_type, event_type FROM audit_expected"
    ):
        try:
            topics.add(router.topic(aggregate_type, event_type))
        except InvalidTopicError:
            continue  # dead-lettered by the pipeline: found in the dead-letter topic
    return sorted(topics)


COUNTS = """
WITH pub AS (SELECT id, count(*) AS copies FROM audit_records WHERE kind = 'p' GROUP BY id),
dead AS (
    SELECT d.id, bool_or(m.how = 'replayed') AS replayed, bool_or(m.how IS NOT NULL) AS resolved
    FROM audit_records d LEFT JOIN audit_records m ON m.kind = 'm' AND m.resolves = d.position
    WHERE d.kind = 'd' GROUP BY d.id
),
judged AS (
    SELECT e.id, e.aggregate_type, e.created_at, coalesce(p.copies, 0) AS copies,
        CASE WHEN d.replayed THEN 'replayed'
             WHEN p.id IS NOT NULL THEN 'published'
             WHEN d.resolved THEN 'discarded'
             WHEN d.id IS NOT NULL THEN 'dead_lettered'
             ELSE 'missing' END AS state
    FROM audit_expected e LEFT JOIN pub p USING (id) LEFT JOIN dead d USING (id)
)
"""


def _judge(conn: psycopg.Connection[Any], report: AuditReport, missing_limit: int | None) -> None:
    """The counts, and the first ``missing_limit`` missing ids (None: every one, into a list)."""
    conn.execute("CREATE INDEX ON audit_records (id)")
    conn.execute("ANALYZE audit_records")
    conn.execute("ANALYZE audit_expected")
    rows = conn.execute(
        COUNTS + "SELECT aggregate_type, state, count(*), sum(greatest(copies - 1, 0)) FROM judged "
        "GROUP BY aggregate_type, state ORDER BY aggregate_type"
    ).fetchall()
    for aggregate_type, state, count, duplicates in rows:
        counts = report.aggregates.setdefault(aggregate_type, AggregateCounts())
        counts.expected += count
        setattr(counts, state, count)
        counts.duplicates += int(duplicates or 0)
    if report.missing and missing_limit != 0:
        report.missing_ids = list(_missing(conn, missing_limit))


MISSING_BATCH = 10_000  # ids fetched from the server at a time


def _missing(conn: psycopg.Connection[Any], limit: int | None = None) -> Iterator[str]:
    """The missing ids, oldest row first, from a server-side cursor: a loss of millions never held here."""
    tail = sql.SQL("") if limit is None else sql.SQL(" LIMIT {}").format(limit)
    query = sql.SQL(COUNTS + "SELECT id FROM judged WHERE state = 'missing' ORDER BY created_at, id{}")
    with conn.transaction(), conn.cursor(name="audit_missing") as cur:
        cur.itersize = MISSING_BATCH
        cur.execute(query.format(tail))
        for (event_id,) in cur:
            yield event_id


def _without_row(conn: psycopg.Connection[Any], settings: Settings, window: Window) -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT count(DISTINCT r.id) FROM audit_records r "
            "WHERE r.kind = 'p' AND r.ts >= %s AND r.ts < %s "
            "AND NOT EXISTS (SELECT 1 FROM audit_expected e WHERE e.id = r.id) "
            "AND NOT EXISTS (SELECT 1 FROM {} o WHERE o.{}::text = r.id)"
        ).format(
            sql.Identifier(settings.table.schema, settings.table.name), sql.Identifier(settings.columns.id)
        ),
        (window.since, window.until),
    ).fetchone()
    return int(row[0]) if row else 0


def audit(
    settings: Settings,
    *,
    since: datetime,
    until: datetime | None = None,
    aggregate_types: tuple[str, ...] = (),
    margin: timedelta = DEFAULT_MARGIN,
    missing_limit: int | None = 20,
    read_timeout: float = 60.0,
    query_timeout: float = 600.0,
    every_missing: Callable[[AuditReport, Iterator[str]], None] | None = None,
) -> AuditReport:
    """Judge the window; the report's ``missing`` is what was lost, ``missing_ids`` the first
    ``missing_limit`` of them (None: every one). ``read_timeout``: the longest a topic's read may make no
    progress; ``query_timeout``: the longest any statement may take (the comparison of millions of rows takes
    minutes). ``every_missing``: called with the finished report and every missing id, read from the server
    as it is consumed, so that a report of any loss takes the same memory."""
    try:
        conn = connect(database_dsn(settings), timeout=query_timeout)
    except SourceConnectionError as exc:
        raise AuditError(f"cannot read the outbox table: {exc}") from exc
    try:
        with conn:
            report = _audit(
                conn, settings, since, until, aggregate_types, margin, missing_limit, read_timeout
            )
            if every_missing is not None:
                every_missing(report, _missing(conn) if report.missing else iter(()))
            return report
    except psycopg.Error as exc:
        raise AuditError(f"the audit's queries failed: {first_line(exc)}") from exc


def _audit(
    conn: psycopg.Connection[Any],
    settings: Settings,
    since: datetime,
    until: datetime | None,
    aggregate_types: tuple[str, ...],
    margin: timedelta,
    missing_limit: int | None,
    read_timeout: float,
) -> AuditReport:
    window = plan(conn, settings, since=since, until=until, margin=margin)
    # One snapshot chooses the rows and notes what it could not see (cdc.ops.audit_mark).
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        scope = audit_mark.scope(conn, settings, window.since)
        chosen = _expected(conn, settings, window, aggregate_types, scope)
    report = AuditReport(
        window=window,
        topics=_topics(conn, settings),
        filtered=bool(aggregate_types),
        carried=chosen.carried,
    )
    conn.execute(
        'CREATE TEMP TABLE audit_records (kind "char", id text, ts timestamptz, position text, '
        "resolves text, how text)"
    )
    start_ms = int((chosen.oldest - margin).timestamp() * 1000)
    with TopicReader(settings, read_timeout=read_timeout) as reader:
        events = reader.ranges(report.topics, start_ms)
        dead = reader.ranges([settings.dlq_topic], start_ms)
        copied = copy_rows(conn, reader.rows(events, event_row))
        copied += copy_rows(conn, reader.rows(dead, dead_letter_row))
    log.info("audit: %d records of %d topics read", copied, len(report.topics) + 1)
    _judge(conn, report, missing_limit)
    report.without_row = _without_row(conn, settings, window)
    report.audited_until = _note_audited(conn, settings, window, report, scope, chosen.late)
    return report


def _note_audited(
    conn: psycopg.Connection[Any],
    settings: Settings,
    window: Window,
    report: AuditReport,
    scope: audit_mark.Scope,
    late: datetime | None,
) -> datetime | None:
    """After a clean audit, move ``cdc_checkpoint.audited_until`` (what `cdc outbox prune --audited` may
    delete before) to the window's end, when the window joins what was audited before (or starts before the
    table's oldest row) and every row before its end was judged: a row of a transaction that committed after
    the acknowledged one was not, and the mark stops at the oldest such row. What the audit's snapshot could
    not see is left to the next one (:mod:`cdc.ops.audit_mark`)."""
    if report.missing or report.filtered:  # a filtered audit judged no row of the other aggregate types
        return scope.before
    if not scope.joins:
        log.info(
            "audit: the window does not join the audited rows (up to %s): audited_until unchanged",
            scope.before,
        )
        return scope.before
    until = window.until if late is None else min(window.until, late)
    return audit_mark.note(conn, settings, until, scope)

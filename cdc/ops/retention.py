"""`cdc outbox prune`: delete old outbox rows in small batches.

Deleting outbox rows is safe at any time after commit: the pipeline reads the inserts from the WAL, never
from the table, and the publication publishes inserts only, so deletes produce no events. Small batches,
each its own transaction, keep locks short and let autovacuum keep up; rows the application holds locked
are skipped, not waited for.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings, created_at_missing
from cdc.errors import AuditRefusedError, ConfigError
from cdc.ops import audit_mark
from cdc.pg import DELETE_LOCKED, connect, database_dsn, tracks_commit_timestamps
from cdc.stream.progress import checkpoint_table, read_position

log = logging.getLogger("cdc.retention")

_PART = re.compile(r"(\d+)\s*(w|d|h|m|s)")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str, option: str = "--older-than") -> timedelta:
    """``7d``, ``12h``, ``1h30m``, ``90s``, ``2w``: a positive duration; errors name ``option``."""
    key = option.lstrip("-").replace("-", "_")
    compact = text.strip().lower().replace(" ", "")
    parts = _PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(
            f"{option} {text!r} is not a duration: use a number with a unit, e.g. 7d, 12h, 1h30m, 90s",
            key=key,
        )
    duration = timedelta(0)
    for number, unit in parts:
        duration += timedelta(**{_UNITS[unit]: int(number)})
    if duration <= timedelta(0):
        raise ConfigError(f"{option} must be longer than zero", key=key)
    return duration


def check_audited(conn: psycopg.Connection[Any], settings: Settings, older_than: timedelta) -> int | None:
    """``--audited``: refuse to delete a row that no clean `cdc audit` covered (``audited_until``). Returns
    the mark's xmin: rows of transactions no older than it were open when the audit looked, and are kept until
    the next one judged them (:mod:`cdc.ops.audit_mark`); None for a mark of an older version."""
    row = conn.execute("SELECT now() - %s", (older_than,)).fetchone()
    assert row is not None
    cutoff = row[0]
    saved = read_position(conn, settings)
    audited = saved.audited_until if saved is not None else None
    if audited is None or cutoff > audited:
        covered = "no row yet" if audited is None else f"the rows created before {audited.isoformat()}"
        since = "<the oldest row's time>" if audited is None else audited.isoformat()
        raise AuditRefusedError(
            f"--audited: pruning rows older than {older_than} would delete rows created up to "
            f"{cutoff.isoformat()}, but a clean `cdc audit` has covered {covered}: run `cdc audit --since "
            f"{since}` first, or prune with a longer --older-than"
        )
    return saved.audited_xmin if saved is not None else None


def _uncovered(
    conn: psycopg.Connection[Any],
    relation: sql.Composable,
    created_at: sql.Identifier,
    older: timedelta,
    xmin: int,
) -> int:
    """Rows older than the cutoff that the last clean audit could not see (its snapshot's xmin)."""
    condition, params = audit_mark.uncovered(xmin)
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {} < now() - %s AND {}").format(
            relation, created_at, condition
        ),
        [older, *params],
    ).fetchone()
    return int(row[0]) if row else 0


def _refuse_unseen(
    conn: psycopg.Connection[Any], settings: Settings, partition: str, created_at: sql.Identifier, xmin: int
) -> None:
    kept = _uncovered(conn, sql.SQL(partition), created_at, timedelta(0), xmin)
    if kept:
        saved = read_position(conn, settings)
        since = saved.audited_until if saved is not None else None
        raise AuditRefusedError(
            f"--audited: partition {partition} holds {kept} rows of transactions that were open during the "
            f"last clean audit, which could not see them: run `cdc audit --since "
            f"{since.isoformat() if since else '<the oldest row time>'}` first, then drop it"
        )


def prune(
    settings: Settings, older_than: timedelta, *, batch_size: int = 10_000, audited: bool = False
) -> int:
    """Delete outbox rows created more than ``older_than`` ago; returns how many were deleted. ``audited``:
    only when `cdc audit` covered every one of them."""
    created_at = settings.columns.created_at
    if created_at is None:
        raise created_at_missing(
            settings,
            "`cdc outbox prune`",
            "; or partition the table by time and drop old partitions instead (--drop-partitions)",
        )
    if batch_size < 1:
        raise ConfigError("--batch-size must be at least 1", key="batch_size")
    table = sql.Identifier(settings.table.schema, settings.table.name)
    total = 0
    with connect(database_dsn(settings), timeout=settings.query_timeout) as conn:
        xmin = check_audited(conn, settings, older_than) if audited else None
        statement = _statement(conn, settings, table, sql.Identifier(created_at), xmin)
        while True:
            deleted = _delete_batch(conn, statement, older_than, batch_size, settings.slot, xmin)
            total += deleted
            if deleted < batch_size:
                break
            log.debug("pruned %d rows so far", total)
        if xmin is not None and (
            kept := _uncovered(conn, table, sql.Identifier(created_at), older_than, xmin)
        ):
            log.info(
                "kept %d rows older than %s: their transactions were open during the last clean audit, which "
                "could not see them; the next `cdc audit` judges them",
                kept,
                older_than,
            )
    log.info("pruned %d outbox rows older than %s", total, older_than)
    return total


def _statement(
    conn: psycopg.Connection[Any],
    settings: Settings,
    table: sql.Identifier,
    created_at: sql.Identifier,
    xmin: int | None,
) -> sql.Composed:
    """One batch's delete, which notes in the same statement how far it pruned (``pruned_until`` of the
    slot's ``cdc_checkpoint`` row: the newest commit time of a deleted row, or its creation time where there
    is no commit timestamp), so that `cdc recover` knows which rows are gone. Without the table (a setup
    older than it) nothing can be noted: said once. ``xmin``: keep the rows the last clean audit could not
    see."""
    keep = sql.SQL("") if xmin is None else sql.SQL(" AND {} < %(xmin)s").format(audit_mark.FULL_XID)
    old = sql.SQL(
        "old AS MATERIALIZED (SELECT tableoid AS rel, ctid AS tid FROM {table}"
        " WHERE {created_at} < now() - %(older)s{keep} LIMIT %(size)s FOR UPDATE SKIP LOCKED)"
    ).format(table=table, created_at=created_at, keep=keep)
    marks = checkpoint_table(settings)
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (marks,)).fetchone()
    if not (found and found[0]):
        log.warning(
            "%s is missing (run `cdc setup`): what this prune deletes is not noted, so a later `cdc recover` "
            "cannot tell that the rows are gone",
            marks,
        )
        return sql.SQL("WITH {old} {delete}").format(
            old=old, delete=sql.SQL(DELETE_LOCKED).format(table=table)
        )
    committed = _commit_time(conn)
    return sql.SQL(
        "WITH {old}, gone AS ({delete} RETURNING greatest({committed}, {created_at}) AS until),"
        " noted AS (INSERT INTO {marks} AS c (slot, updated_at, pruned_until)"
        " SELECT %(slot)s, now(), max(until) FROM gone HAVING count(*) > 0"
        " ON CONFLICT (slot) DO UPDATE SET pruned_until = greatest(c.pruned_until, excluded.pruned_until))"
        " SELECT count(*) FROM gone"
    ).format(
        old=old,
        delete=sql.SQL(DELETE_LOCKED).format(table=table),
        committed=committed,
        created_at=created_at,
        marks=sql.SQL(marks),
    )


def _delete_batch(
    conn: psycopg.Connection[Any],
    statement: sql.Composed,
    older: timedelta,
    size: int,
    slot: str,
    xmin: int | None,
) -> int:
    cursor = conn.execute(statement, {"older": older, "size": size, "slot": slot, "xmin": xmin})
    row = cursor.fetchone() if cursor.description else None
    return int(row[0]) if row is not None else cursor.rowcount


def _commit_time(conn: psycopg.Connection[Any]) -> sql.SQL:
    """A row's commit time, where the server keeps it (track_commit_timestamp), else NULL."""
    tracked = tracks_commit_timestamps(conn)
    return sql.SQL("pg_xact_commit_timestamp(xmin)" if tracked else "NULL::timestamptz")


def drop_partitions(settings: Settings, older_than: timedelta, *, audited: bool = False) -> list[str]:
    """Drop the partitions of a partitioned outbox (range-partitioned by creation time) whose upper bound is
    more than ``older_than`` ago: instant, and no dead rows for vacuum. Before each drop, the newest commit
    (or creation) time of its rows is noted as ``pruned_until`` (a scan of the partition), in the same
    transaction, for `cdc recover`. Partitions with no upper bound (MAXVALUE, DEFAULT) are kept."""
    created_at = settings.columns.created_at
    table = sql.Identifier(settings.table.schema, settings.table.name)
    dropped: list[str] = []
    # The scan of a large partition may take a while: no bound on it but the kernel's. A drop waits for no
    # one's lock for long, though: an exclusive lock request queued behind a writer would stop every writer.
    with connect(database_dsn(settings), timeout=None) as conn:
        conn.execute("SELECT set_config('lock_timeout', '5s', false)")
        xmin = check_audited(conn, settings, older_than) if audited else None
        name = table.as_string(conn)
        kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (name,)).fetchone()
        if kind is None or kind[0] != "p":
            raise ConfigError(
                f"--drop-partitions needs a partitioned outbox, and {settings.table} is not one: prune it "
                "without the flag (rows are deleted in batches)",
                key="table",
            )
        old = conn.execute(
            "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,"
            " LATERAL (SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), $$TO \\('([^']*)'\\)$$))[1]"
            " AS upper) b WHERE i.inhparent = %s::regclass AND b.upper IS NOT NULL"
            " AND b.upper::timestamptz <= now() - %s ORDER BY b.upper::timestamptz",
            (name, older_than),
        ).fetchall()
        marks = checkpoint_table(settings)
        committed = _commit_time(conn)
        newest = (
            sql.SQL("greatest({}, {})").format(committed, sql.Identifier(created_at))
            if created_at
            else committed
        )
        for (partition,) in old:
            if xmin is not None and created_at:
                _refuse_unseen(conn, settings, partition, sql.Identifier(created_at), xmin)
            with conn.transaction():
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {marks} AS c (slot, updated_at, pruned_until)"
                        " SELECT %s, now(), max({newest}) FROM {part} HAVING count(*) > 0"
                        " ON CONFLICT (slot) DO UPDATE"
                        " SET pruned_until = greatest(c.pruned_until, excluded.pruned_until)"
                    ).format(marks=sql.SQL(marks), newest=newest, part=sql.SQL(partition)),
                    (settings.slot,),
                )
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(partition)))
            log.info("dropped partition %s of %s", partition, settings.table)
            dropped.append(partition)
    return dropped

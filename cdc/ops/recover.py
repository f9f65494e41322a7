"""`cdc recover`: when the slot is lost, the outbox table is its backup.

A slot that is missing (dropped, gone with a failover before PostgreSQL 17) or invalidated (``wal_status =
lost``) took with it the changes it held. Every outbox row that the lost slot may not have delivered is
still in the table, unless it was pruned. Recover:

1. plans, and refuses with the reason when it should not run: the slot is healthy, a pipeline streams from
   it, there is no saved position and no ``--since``, or the table was pruned past the point it needs;
2. marks the slot as recovering in ``cdc_checkpoint``, so that `cdc run` refuses to stream from the new slot
   before the republish is done (a crashed recover is run again, never half-trusted);
3. drops the invalidated slot, and creates the new one on a replication connection with ``EXPORT_SNAPSHOT``:
   the snapshot holds exactly the transactions committed before the slot's consistent point, and the slot
   streams every one committed after it, so the two meet without a gap;
4. in that snapshot, republishes the rows committed since the start point through the pipeline's own code
   (:mod:`cdc.ops.republish`), and waits until Kafka acknowledged each of them;
5. clears the mark. On any failure before that, the new slot is dropped again.

The start point is the commit time of the last outbox transaction Kafka acknowledged, which `cdc run` saves
(:mod:`cdc.stream.progress`), or where `cdc setup` created the slot when it acknowledged nothing, minus a
margin. Rows are chosen by their inserting transaction's commit timestamp (``track_commit_timestamp = on``,
which `cdc setup` asks for): the server's clock at commit, the same the saved time comes from, whatever the
transaction's length or the application's clock. The margin only covers commit timestamps that are not in
commit order (each is taken just before its commit record is written) and steps of the server's clock; what
it adds is duplicates, which consumers drop. Without commit timestamps, rows can only be chosen by
``created_at``, which misses a transaction longer than the margin or a writer whose clock is slow by more:
recover says so and refuses unless ``--accept-gap``.

"Pruned" is said only when it is known: `cdc outbox prune` notes in ``cdc_checkpoint.pruned_until`` the
newest commit (or creation) time of a row it deleted, and recover refuses, unless ``--accept-gap``, when
that is at or after the start point (checked again inside the new slot's snapshot). A table younger than the
start point, with nothing pruned, recovers as it is. Deletes by other means (``DELETE``, ``TRUNCATE``, a
dropped partition that `cdc outbox prune` did not drop) leave no mark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import pq, sql

from cdc.config import Settings
from cdc.errors import (
    ConfigError,
    RecoveryError,
    RecoveryRefusedError,
    SourceConnectionError,
    first_line,
    format_lsn,
    parse_lsn,
)
from cdc.ops.republish import Progress, RepublishResult, RowFilter, count_rows, republish
from cdc.ops.status import forget_slot_checkpoint
from cdc.pg import connect, database_dsn, tracks_commit_timestamps
from cdc.stream.preflight import check_wal_level, slot_identity
from cdc.stream.progress import SavedPosition, checkpoint_table, read_position
from cdc.stream.source import quote_ident

__all__ = ["DEFAULT_MARGIN", "Plan", "plan", "recover"]

log = logging.getLogger("cdc.recover")

DEFAULT_MARGIN = timedelta(minutes=10)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What recover found and will do."""

    slot: str
    state: str  # "missing", "invalidated" or "unfinished" (a recover that did not finish)
    saved: SavedPosition | None
    since: datetime
    by_commit: bool  # rows chosen by their commit timestamp (track_commit_timestamp), else by created_at
    accept_gap: bool
    rows: int  # outbox rows chosen

    @property
    def rows_filter(self) -> RowFilter:
        return _rows(since=self.since, by_commit=self.by_commit)

    def describe(self) -> str:
        lines = [f"slot {self.slot}: {self.state}"]
        if self.saved is not None and self.saved.confirmed_lsn is not None and self.saved.commit_time:
            lines.append(
                f"last saved position: LSN {format_lsn(self.saved.confirmed_lsn)}, last acknowledged outbox "
                f"transaction committed {_iso(self.saved.commit_time)}"
            )
        elif self.saved is not None and self.saved.slot_created_at is not None:
            lines.append(f"the slot acknowledged nothing; it was created {_iso(self.saved.slot_created_at)}")
        how = "committed" if self.by_commit else "created (track_commit_timestamp is off)"
        lines.append(f"republish {self.rows} outbox rows {how} since {_iso(self.since)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Recovered:
    plan: Plan
    consistent_point: int
    result: RepublishResult


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def plan(
    settings: Settings,
    *,
    since: datetime | None = None,
    margin: timedelta = DEFAULT_MARGIN,
    accept_gap: bool = False,
) -> Plan:
    """Look, change nothing: refuse with the reason, or say what recover would do."""
    with connect(database_dsn(settings), timeout=settings.query_timeout) as conn:
        check_wal_level(conn)
        by_commit = tracks_commit_timestamps(conn)
        if not by_commit and settings.columns.created_at is None:
            raise ConfigError(
                "recover chooses rows by commit time, and track_commit_timestamp is off: turn it on "
                "(ALTER SYSTEM SET track_commit_timestamp = on; then restart PostgreSQL), or set "
                "columns.created_at to choose by creation time; or republish by id or type with "
                "`cdc outbox republish`",
                key="columns.created_at",
            )
        if not by_commit and not accept_gap:
            raise RecoveryRefusedError(
                "track_commit_timestamp is off, so recover can choose rows only by created_at, and cannot "
                "prove it finds a transaction that ran longer than --margin or a writer whose clock is "
                "slow by more: those rows would be missed. Turn it on (ALTER SYSTEM SET "
                "track_commit_timestamp = on; then restart PostgreSQL: rows committed after that are chosen "
                "by their commit), or re-run with --accept-gap to choose by created_at"
            )
        saved = read_position(conn, settings)
        state = _slot_state(conn, settings, saved)
        if since is None:
            start = None if saved is None else saved.commit_time or saved.slot_created_at
            if start is None:
                raise RecoveryRefusedError(
                    f"no saved position for slot '{settings.slot}' in {checkpoint_table(settings)} (the "
                    "pipeline writes it once Kafka acknowledged an outbox transaction): give the time to "
                    "republish from with --since"
                )
            since = start - margin
        rows = count_rows(conn, settings, _rows(since=since, by_commit=by_commit)).rows
    if not accept_gap:
        check_not_pruned(saved, since, settings)
    return Plan(
        slot=settings.slot,
        state=state,
        saved=saved,
        since=since,
        by_commit=by_commit,
        accept_gap=accept_gap,
        rows=rows,
    )


def _rows(*, since: datetime, by_commit: bool) -> RowFilter:
    """Rows committed since ``since`` (commit timestamps), or, without them, created since."""
    return RowFilter(committed_since=since) if by_commit else RowFilter(since=since)


def check_not_pruned(saved: SavedPosition | None, since: datetime, settings: Settings) -> None:
    """Refuse when `cdc outbox prune` deleted rows committed at or after the start point: some of them the
    lost slot may not have delivered. Deletes by other means (DELETE, TRUNCATE) leave no mark."""
    pruned = None if saved is None else saved.pruned_until
    if pruned is not None and pruned >= since:
        raise RecoveryRefusedError(
            f"`cdc outbox prune` deleted outbox rows of {settings.table} up to {_iso(pruned)}, after the "
            f"start point {_iso(since)}: rows the lost slot may not have delivered can be gone. Republish "
            "them from elsewhere, or re-run with --accept-gap to republish what is left"
        )


def _slot_state(conn: psycopg.Connection[Any], settings: Settings, saved: SavedPosition | None) -> str:
    slot = settings.slot
    extra = ", invalidation_reason" if conn.info.server_version >= 170000 else ", NULL"
    row = conn.execute(
        f"SELECT active, active_pid, wal_status, restart_lsn IS NULL{extra} FROM pg_replication_slots"
        " WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return "missing"
    active, pid, wal_status, no_restart, reason = row
    if active:
        raise RecoveryRefusedError(
            f"replication slot '{slot}' is in use by pid {pid}: stop the pipeline (or whatever streams from "
            "it) before `cdc recover`"
        )
    if wal_status == "lost" or no_restart or reason is not None:
        return "invalidated"
    if saved is not None and saved.recovering_since is not None:
        return "unfinished"
    raise RecoveryRefusedError(
        f"replication slot '{slot}' is healthy: there is nothing to recover. `cdc outbox republish` "
        "publishes rows again without touching the slot"
    )


def recover(
    settings: Settings,
    chosen: Plan,
    *,
    failover: bool = False,
    progress: Progress | None = None,
    mark: str | None = None,
) -> Recovered:
    """Carry out ``chosen``: mark, re-create the slot, republish in its snapshot, unmark."""
    s = settings
    with connect(database_dsn(s)) as conn:
        if failover and conn.info.server_version < 170000:
            major = conn.info.server_version // 10000
            raise RecoveryRefusedError(f"failover slots need PostgreSQL 17 or later; this server is {major}")
        _ensure_table(conn, s)
        if s.delivery == "exactly-once":  # the lost slot's checkpoint: never to be read again
            log.info("%s", forget_slot_checkpoint(s, slot_identity(s).key))
        _mark(conn, s, recovering=True)
        if chosen.state != "missing":
            _drop_slot(conn, s.slot)
            log.info("dropped the %s slot %s", chosen.state, s.slot)
    replication = _replication_connection(database_dsn(s))
    created = False
    try:
        consistent_point, snapshot = _create_slot(replication, s.slot, failover=failover)
        created = True
        log.info(
            "created slot %s at %s; republishing in its snapshot the rows created since %s",
            s.slot,
            format_lsn(consistent_point),
            _iso(chosen.since),
        )
        with connect(database_dsn(s)) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            if not chosen.accept_gap:  # a prune since the plan was made: seen in the snapshot
                check_not_pruned(read_position(reader, s), chosen.since, s)
            result = republish(
                s,
                chosen.rows_filter,
                mark=mark or f"recover {_iso(datetime.now(UTC))}",
                progress=progress,
                conn=reader,
            )
            reader.execute("COMMIT")
        with connect(database_dsn(s)) as conn:
            _mark(conn, s, recovering=False, confirmed_lsn=consistent_point)
        created = False  # done: the slot stays
    finally:
        replication.close()
        if created:
            _drop_new_slot(s)
    return Recovered(chosen, consistent_point, result)


def _ensure_table(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """`cdc setup` makes the table; a setup older than it gets it here (the same script)."""
    from cdc.ops.setup import render

    step = next(step for step in render(settings) if step.name == "06_checkpoint.sql")
    conn.execute(step.sql.encode())


def _mark(
    conn: psycopg.Connection[Any], settings: Settings, *, recovering: bool, confirmed_lsn: int | None = None
) -> None:
    table = checkpoint_table(settings)
    if recovering:
        conn.execute(
            f"INSERT INTO {table} AS c (slot, confirmed_lsn, commit_time, updated_at, recovering_since)"
            " VALUES (%s, NULL, NULL, now(), now())"
            " ON CONFLICT (slot) DO UPDATE SET recovering_since = now()",
            (settings.slot,),
        )
        return
    # The commit time stays: a slot lost again before the pipeline saved a newer one starts from there. The
    # new slot's identity (cdc.stream.identity) is where it was created.
    # The republished events went out with the configured partitioner: the slot's record, when it had none
    # (a slot that had acknowledged nothing), so that `cdc run` does not take it for the old default.
    conn.execute(
        f"UPDATE {table} SET recovering_since = NULL, updated_at = now(),"
        " confirmed_lsn = greatest(confirmed_lsn, %s::pg_lsn),"
        " slot_created_lsn = %s::pg_lsn, slot_created_at = now(),"
        " partitioner = coalesce(partitioner, %s) WHERE slot = %s",
        (format_lsn(confirmed_lsn or 0), format_lsn(confirmed_lsn or 0), settings.partitioner, settings.slot),
    )


def _drop_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    try:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
    except psycopg.errors.ObjectInUse as exc:
        raise RecoveryRefusedError(
            f"replication slot '{slot}' was taken while recover ran: stop the pipeline and run it again"
        ) from exc


def _drop_new_slot(settings: Settings) -> None:
    try:
        with connect(database_dsn(settings)) as conn:
            _drop_slot(conn, settings.slot)
    except Exception as exc:  # noqa: BLE001 - reported, and `cdc run` refuses the slot anyway (the mark)
        log.error(
            "could not drop the new slot %s after a failed recover (%s): `cdc run` refuses it until "
            "`cdc recover` is run again",
            settings.slot,
            first_line(exc),
        )
    else:
        log.warning("dropped the new slot %s: the recover did not finish; run it again", settings.slot)


def _replication_connection(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, replication="database", autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"cannot open a replication connection: {first_line(exc)}") from exc


def _create_slot(conn: psycopg.Connection[Any], slot: str, *, failover: bool) -> tuple[int, str]:
    """CREATE_REPLICATION_SLOT with an exported snapshot: (consistent point, snapshot name). The snapshot
    lives as long as this connection runs no other command."""
    name = quote_ident(slot)
    if conn.info.server_version >= 150000:
        options = "SNAPSHOT 'export'" + (", FAILOVER true" if failover else "")
        command = f"CREATE_REPLICATION_SLOT {name} LOGICAL pgoutput ({options})"
    else:
        command = f"CREATE_REPLICATION_SLOT {name} LOGICAL pgoutput EXPORT_SNAPSHOT"
    result = conn.pgconn.exec_(command.encode())
    if result.status != pq.ExecStatus.TUPLES_OK:
        message = (result.error_message or b"").decode(errors="replace").strip()
        raise RecoveryError(f"could not create replication slot '{slot}': {message}")
    point, snapshot = result.get_value(0, 1), result.get_value(0, 2)
    if point is None or snapshot is None:
        raise RecoveryError(f"CREATE_REPLICATION_SLOT '{slot}' returned no consistent point or snapshot")
    return parse_lsn(point.decode()), snapshot.decode()

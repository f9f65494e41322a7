"""`cdc status` and `cdc teardown`: what the slot holds back, and removing what `cdc setup` made.

Status reads only catalog views and the outbox table, so it can run next to a streaming pipeline and serve
as an alerting check: a missing or invalidated slot is an error (non-zero exit), after the report.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from cdc.config import Settings
from cdc.errors import (
    CdcError,
    RecoveryUnfinishedError,
    SinkError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotMissingError,
    SourceConnectionError,
    format_lsn,
    parse_lsn,
)
from cdc.pg import connect, database_dsn
from cdc.stream import failover
from cdc.stream.admin import ask
from cdc.stream.checkpoint_topic import forget_checkpoint, read_checkpoint
from cdc.stream.heartbeat import heartbeat_table
from cdc.stream.preflight import slot_identity
from cdc.stream.progress import checkpoint_table, read_position
from cdc.stream.source import quote_ident

log = logging.getLogger("cdc.status")
CHECKPOINT_TIMEOUT = 10.0  # seconds one read of the checkpoint topic may take


@dataclass(frozen=True, slots=True)
class SlotStatus:
    slot: str
    present: bool
    active: bool = False
    active_pid: int | None = None
    wal_status: str | None = None
    confirmed_flush_lsn: str | None = None
    restart_lsn: str | None = None
    current_wal_lsn: str | None = None
    lag_bytes: int | None = None
    retained_wal_bytes: int | None = None
    safe_wal_size: int | None = None
    outbox_rows: int | None = None
    oldest_row_age_s: float | None = None
    last_heartbeat_seen: str | None = None
    server_version: str | None = None
    # PostgreSQL 17+: since when the slot is unused, why it was invalidated, whether it is a failover slot,
    # and whether the standby of a multi-host database_url holds it synchronized (cdc.stream.failover).
    inactive_since: str | None = None
    invalidation_reason: str | None = None
    failover: bool | None = None
    synced_on_standby: bool | None = None
    failover_problems: list[str] | None = None
    # Exactly-once: the last committed checkpoint in Kafka (cdc.stream.transactions), which the slot's
    # confirmed position may trail but never pass.
    delivery: str = "at-least-once"
    checkpoint_lsn: str | None = None
    checkpoint_commit_time: str | None = None
    checkpoint_problem: str | None = None
    # What `cdc run` saved for `cdc recover` (cdc.stream.progress): the commit time of the last outbox
    # transaction Kafka acknowledged, and whether a recover of the slot is under way (or died).
    saved_commit_time: str | None = None
    recovering_since: str | None = None
    slot_created_at: str | None = None  # when `cdc setup` or `cdc recover` created it
    # The cluster's other replication slots: any role with REPLICATION can make or drop one, so an
    # unexpected one is worth a look (docs/operations.md, "Least privilege").
    other_slots: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self) -> CdcError | None:
        """What makes this status an alert: a slot that is missing or lost."""
        if not self.present:
            made = self.saved_commit_time or self.slot_created_at  # it existed: lost, not never made
            fix = "run `cdc recover`" if made else "create it with `cdc setup`"
            return SlotMissingError(f"replication slot '{self.slot}' does not exist; {fix}")
        if self.wal_status == "lost" or self.invalidation_reason is not None:
            why = f"invalidation_reason = {self.invalidation_reason}" if self.invalidation_reason else ""
            return SlotInvalidatedError(
                f"replication slot '{self.slot}' was invalidated ({why or 'wal_status = lost'}): "
                "events may be missing; run `cdc recover`"
            )
        if self.recovering_since is not None:
            return RecoveryUnfinishedError(
                f"a `cdc recover` of slot '{self.slot}' started {self.recovering_since} and has not finished"
            )
        return None


def slot_status(settings: Settings) -> SlotStatus:
    status = _slot_status(settings)
    if settings.delivery != "exactly-once":
        return status
    try:
        key = slot_identity(settings).key
        # A broker that has just started may answer "not yet" for a moment: asked again up to startup_timeout.
        checkpoint = ask(
            lambda left: read_checkpoint(settings, key, timeout=min(left, CHECKPOINT_TIMEOUT)),
            what=f"the checkpoint topic {settings.checkpoint_topic}",
            bound=settings.startup_timeout,
        )
    except (SinkError, KafkaException, SourceConnectionError) as exc:
        return replace(status, delivery=settings.delivery, checkpoint_problem=str(exc))
    if checkpoint is None:
        return replace(status, delivery=settings.delivery, checkpoint_problem="no checkpoint committed yet")
    return replace(
        status,
        delivery=settings.delivery,
        checkpoint_lsn=format_lsn(checkpoint.end_lsn),
        checkpoint_commit_time=datetime.fromtimestamp(checkpoint.commit_time_us / 1e6, tz=UTC).isoformat(),
    )


def _slot_status(settings: Settings) -> SlotStatus:
    with connect(database_dsn(settings)) as conn:
        current = conn.execute(
            "SELECT pg_current_wal_lsn()::text, current_setting('server_version')"
        ).fetchone()
        version = conn.info.server_version
        pg17 = ", inactive_since::text, invalidation_reason" if version >= 170000 else ", NULL, NULL"
        row = conn.execute(
            "SELECT active, active_pid, wal_status, confirmed_flush_lsn::text, restart_lsn::text,"
            f" safe_wal_size{pg17} FROM pg_replication_slots WHERE slot_name = %s",
            (settings.slot,),
        ).fetchone()
        rows, age = _outbox_rows(conn, settings)
        heartbeat = _last_heartbeat(conn, settings)
        saved = read_position(conn, settings)
        readiness = failover.check(conn, database_dsn(settings), settings.slot)
        others = [
            f"{name} ({plugin}{', database ' + db if db else ''}, {'active' if active else 'inactive'})"
            for name, plugin, db, active in conn.execute(
                "SELECT slot_name, coalesce(plugin, 'physical'), coalesce(database, ''), active"
                " FROM pg_replication_slots WHERE slot_name <> %s ORDER BY slot_name",
                (settings.slot,),
            ).fetchall()
        ]
    current_lsn = current[0] if current else None
    server = current[1] if current else None
    recovery: dict[str, Any] = {}
    recovery["other_slots"] = others
    if saved is not None:
        if saved.commit_time is not None:
            recovery["saved_commit_time"] = saved.commit_time.astimezone(UTC).isoformat()
        if saved.recovering_since is not None:
            recovery["recovering_since"] = saved.recovering_since.astimezone(UTC).isoformat()
        if saved.slot_created_at is not None:
            recovery["slot_created_at"] = saved.slot_created_at.astimezone(UTC).isoformat()
    if row is None:
        return SlotStatus(
            **recovery,
            slot=settings.slot,
            present=False,
            current_wal_lsn=current_lsn,
            outbox_rows=rows,
            oldest_row_age_s=age,
            last_heartbeat_seen=heartbeat,
            server_version=server,
        )
    active, pid, wal_status, confirmed, restart, safe, inactive_since, reason = row
    now = parse_lsn(current_lsn) if current_lsn else None
    return SlotStatus(
        slot=settings.slot,
        present=True,
        active=bool(active),
        active_pid=pid,
        wal_status=wal_status,
        confirmed_flush_lsn=confirmed,
        restart_lsn=restart,
        current_wal_lsn=current_lsn,
        lag_bytes=None if now is None or not confirmed else max(0, now - parse_lsn(confirmed)),
        retained_wal_bytes=None if now is None or not restart else max(0, now - parse_lsn(restart)),
        safe_wal_size=safe,
        outbox_rows=rows,
        oldest_row_age_s=age,
        last_heartbeat_seen=heartbeat,
        server_version=server,
        inactive_since=inactive_since,
        invalidation_reason=reason,
        failover=None if readiness is None else readiness.failover,
        synced_on_standby=None if readiness is None else readiness.synced_on_standby,
        failover_problems=None if readiness is None else readiness.problems,
        **recovery,
    )


def _last_heartbeat(conn: psycopg.Connection[Any], settings: Settings) -> str | None:
    """When `cdc run` last read its own heartbeat back from the stream (None: never, or no table)."""
    table = heartbeat_table(settings)
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(f"SELECT seen_at FROM {table} WHERE slot = %s", (settings.slot,)).fetchone()
    return None if row is None else str(row[0].isoformat())


def _outbox_rows(conn: psycopg.Connection[Any], settings: Settings) -> tuple[int | None, float | None]:
    table = f"{quote_ident(settings.table.schema)}.{quote_ident(settings.table.name)}"
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not exists or not exists[0]:
        return None, None
    created_at = settings.columns.created_at
    if created_at is None:
        count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return (count[0] if count else None), None
    row = conn.execute(
        f"SELECT count(*), extract(epoch FROM now() - min({quote_ident(created_at)})) FROM {table}"
    ).fetchone()
    if row is None:
        return None, None
    return row[0], (None if row[1] is None else round(float(row[1]), 1))


def render(status: SlotStatus) -> str:
    """A readable two-column table."""
    lines = []
    for key, value in status.as_dict().items():
        if key.endswith("_bytes") or key == "safe_wal_size":
            shown = "-" if value is None else f"{value:,} bytes"
        elif value is None:
            shown = "-"
        elif isinstance(value, list):
            shown = "none" if not value else ("\n" + " " * 23).join(value)
        else:
            shown = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"{key.replace('_', ' '):<22} {shown}")
    return "\n".join(lines)


def teardown(settings: Settings) -> list[str]:
    """Drop the slot and the publication. Refuses while the slot is in use; the table is left alone. With
    exactly-once delivery, the slot's checkpoint in Kafka is forgotten too (a tombstone)."""
    done = []
    identity = slot_identity(settings) if settings.delivery == "exactly-once" else None
    with connect(database_dsn(settings)) as conn:
        row = conn.execute(
            "SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)
        ).fetchone()
        if row is not None and row[0]:
            raise SlotActiveError(
                f"replication slot '{settings.slot}' is in use by pid {row[1]}: stop the pipeline first"
            )
        if row is not None:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot,))
            done.append(f"dropped slot {settings.slot}")
        else:
            done.append(f"slot {settings.slot} was not there")
        if read_position(conn, settings) is not None:
            conn.execute(f"DELETE FROM {checkpoint_table(settings)} WHERE slot = %s", (settings.slot,))
            done.append(f"forgot the saved position of slot {settings.slot}")
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.publication,)
        ).fetchone()
        if exists:
            conn.execute(f"DROP PUBLICATION {quote_ident(settings.publication)}")
            done.append(f"dropped publication {settings.publication}")
        else:
            done.append(f"publication {settings.publication} was not there")
    if identity is not None:
        done.append(forget_slot_checkpoint(settings, identity.key))
    return done


def forget_slot_checkpoint(settings: Settings, key: bytes) -> str:
    """A tombstone for the slot's exactly-once checkpoint; best effort: the key names the slot's creation
    point, so a slot made again never reads the old checkpoint anyway."""
    try:
        written = forget_checkpoint(settings, key, timeout=10)
    except SinkError as exc:
        log.warning("the slot's checkpoint in Kafka was not forgotten (%s): it is never read again", exc)
        return f"could not write a tombstone for checkpoint {key.decode()} in {settings.checkpoint_topic}"
    if not written:
        return f"no checkpoint topic {settings.checkpoint_topic}"
    return f"wrote a tombstone for checkpoint {key.decode()} in {settings.checkpoint_topic}"

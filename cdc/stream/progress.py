"""The saved position: how far Kafka has acknowledged the outbox, noted in the database for `cdc recover`.

A lost slot (dropped, invalidated by ``max_slot_wal_keep_size``, gone with a failover before PostgreSQL 17)
takes with it the only record of what was delivered. The outbox table still holds the rows; to know which of
them the lost slot may not have delivered, `cdc run` notes in the ``cdc_checkpoint`` table (one row per
slot, made by `cdc setup`) the slot's confirmed position and the commit time of the last outbox transaction
Kafka acknowledged before it. Every outbox row committed later was created after that time, give or take
the margin that `cdc recover` subtracts (``created_at`` is the application's clock, and a transaction's rows
are created before it commits).

Written at most every ``status_interval``, and only when an outbox transaction was acknowledged since the
last write: never per event, and an idle outbox writes nothing (the write is a transaction in the WAL, which
the slot reads back; it carries no outbox event, so it never moves what is written next). Best effort, like
the heartbeat: a failure is a warning, and the saved position only lags, which costs `cdc recover` more
duplicates, never an event.

Beside it, the partitioner the slot's events were published with: `cdc run` refuses to change it unnoticed
(:func:`settle_partitioner`).

While a recover runs, ``recovering_since`` is set: `cdc run` refuses to stream from a slot whose recover did
not finish (:func:`check_not_recovering`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings
from cdc.errors import (
    PartitionerChangeError,
    RecoveryUnfinishedError,
    SourceConnectionError,
    StartupRefusal,
    first_line,
    format_lsn,
    parse_lsn,
)
from cdc.pg import connect_bounded, database_dsn, side_write_timeout

log = logging.getLogger("cdc.progress")

CHECKPOINT_TABLE = "cdc_checkpoint"
STATEMENT_TIMEOUT_MS = 5000
LOCK_TIMEOUT_MS = 2000


def checkpoint_table(settings: Settings) -> str:
    """The quoted name of the saved positions' table, beside the outbox (made by `cdc setup`)."""
    return sql.Identifier(settings.table.schema, CHECKPOINT_TABLE).as_string()


@dataclass(frozen=True, slots=True)
class SavedPosition:
    """A slot's row of ``cdc_checkpoint``."""

    slot: str
    confirmed_lsn: int | None  # None: the slot has acknowledged nothing yet (a row of `cdc setup`'s)
    commit_time: datetime | None  # of the last outbox transaction Kafka acknowledged up to confirmed_lsn
    updated_at: datetime
    recovering_since: datetime | None
    # The slot's identity, from `cdc setup` or `cdc recover` (None for a slot of an older setup).
    slot_created_lsn: int | None = None
    slot_created_at: datetime | None = None
    pruned_until: datetime | None = None  # the newest row `cdc outbox prune` deleted
    partitioner: str | None = None  # what the slot's events were published with (None: not recorded)
    audited_until: datetime | None = None  # every row created before it passed a `cdc audit`...
    audited_xmin: int | None = None  # ...if written by a transaction older than this (cdc.ops.audit_mark)


def read_position(conn: psycopg.Connection[Any], settings: Settings) -> SavedPosition | None:
    """The slot's saved position; None when there is none, or no table (a setup older than the table)."""
    return _read(conn, checkpoint_table(settings), settings.slot)


def _read(conn: psycopg.Connection[Any], table: str, slot: str) -> SavedPosition | None:
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not exists or not exists[0]:
        return None
    # As JSON: a table of an older setup lacks the newer columns, which then read as NULL.
    row = conn.execute(f"SELECT to_jsonb(c) FROM {table} AS c WHERE slot = %s", (slot,)).fetchone()
    if row is None:
        return None
    c: dict[str, Any] = row[0]
    return SavedPosition(
        slot,
        _lsn(c.get("confirmed_lsn")),
        _time(c.get("commit_time")),
        _time(c.get("updated_at")) or datetime.now(UTC),
        _time(c.get("recovering_since")),
        slot_created_lsn=_lsn(c.get("slot_created_lsn")),
        slot_created_at=_time(c.get("slot_created_at")),
        pruned_until=_time(c.get("pruned_until")),
        partitioner=c.get("partitioner"),
        audited_until=_time(c.get("audited_until")),
        audited_xmin=None if c.get("audited_xmin") is None else int(c["audited_xmin"]),
    )


def _lsn(text: str | None) -> int | None:
    return None if text is None else parse_lsn(text)


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def check_not_recovering(conn: psycopg.Connection[Any], table: str, slot: str) -> SavedPosition | None:
    """Refuse to stream from a slot that a `cdc recover` made and did not finish republishing for; else
    the slot's saved position."""
    position = _read(conn, table, slot)
    if position is not None and position.recovering_since is not None:
        raise RecoveryUnfinishedError(
            f"slot '{slot}' was re-created by a `cdc recover` that did not finish (started "
            f"{position.recovering_since.isoformat(timespec='seconds')}): streaming from it now would skip "
            "events of the lost slot. Run `cdc recover` again"
        )
    return position


# Every slot published with librdkafka's default partitioner before the setting existed (and was recorded).
UNRECORDED_PARTITIONER = "consistent_random"


def settle_partitioner(settings: Settings, *, accept_change: bool = False) -> None:
    """At start: refuse to publish a slot's events with another partitioner than the one it published with,
    unless ``accept_change``: its keys would land on other partitions, and each aggregate's order break for
    its consumers at the switch. Then record the partitioner used now beside the saved position."""
    try:
        _settle_partitioner(settings, accept_change)
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"PostgreSQL: {first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise StartupRefusal(
            f"cannot read or record the slot's partitioner in {checkpoint_table(settings)}: {first_line(exc)}"
            " (the role of `cdc run` needs SELECT, INSERT and UPDATE on it, which `cdc setup --role` grants)"
        ) from exc


def published_with(position: SavedPosition | None) -> str | None:
    """The partitioner the slot's events were published with; None for a slot that published nothing."""
    used = None if position is None else position.partitioner
    if used is None and position is not None and position.confirmed_lsn is not None:
        used = UNRECORDED_PARTITIONER
    return used


def partitioner_change(settings: Settings, used: str) -> PartitionerChangeError:
    wanted = settings.partitioner
    return PartitionerChangeError(
        f"slot '{settings.slot}' published its events with partitioner = '{used}', and partitioner = "
        f"'{wanted}' would put the same keys on other partitions: each aggregate's events would be "
        "split over two partitions at the switch, out of order for its consumers. Keep "
        f"partitioner = '{used}' (CDC_PARTITIONER), or switch on purpose: let the consumers drain "
        "the topics (every event read, no older one left on an aggregate's old partition), then "
        "start once with `cdc run --accept-partitioner-change`"
    )


def _settle_partitioner(settings: Settings, accept_change: bool) -> None:
    table = checkpoint_table(settings)
    wanted = settings.partitioner
    with connect_bounded(
        database_dsn(settings),
        statement_ms=STATEMENT_TIMEOUT_MS,
        lock_ms=LOCK_TIMEOUT_MS,
        timeout=side_write_timeout(settings.query_timeout, STATEMENT_TIMEOUT_MS),
    ) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if not exists or not exists[0]:
            return  # an older setup: PositionWriter says to run `cdc setup`
        position = _read(conn, table, settings.slot)
        used = published_with(position)
        if used == wanted and position is not None and position.partitioner == wanted:
            return
        if used not in (None, wanted) and not accept_change:
            raise partitioner_change(settings, used)
        if used not in (None, wanted):
            log.warning(
                "partitioner changed from '%s' to '%s' (--accept-partitioner-change): keys move to other "
                "partitions from here on",
                used,
                wanted,
            )
        try:
            conn.execute(
                f"INSERT INTO {table} AS c (slot, partitioner, updated_at) VALUES (%s, %s, now())"
                " ON CONFLICT (slot) DO UPDATE SET partitioner = excluded.partitioner",
                (settings.slot, wanted),
            )
        except psycopg.errors.UndefinedColumn:
            log.warning(
                "the partitioner is not recorded beside the saved position: run `cdc setup` to add the "
                "column to %s",
                table,
            )


class PositionWriter:
    """Notes the saved position, on a connection of its own, at most every ``status_interval``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.interval = settings.status_interval
        self.saves = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._last_try = float("-inf")  # monotonic
        self._saved_commit_us = 0
        self._table_missing = False

    def offer(self, now: float, confirmed_lsn: int, last_outbox: tuple[int, int]) -> None:
        """The slot was confirmed up to ``confirmed_lsn``; ``last_outbox`` is (end LSN, commit time in µs
        since the Unix epoch) of the last acknowledged transaction that held outbox events. Saved when that
        transaction is covered by the confirmed position, new since the last save, and the interval has
        passed."""
        end_lsn, commit_us = last_outbox
        if (
            not commit_us
            or commit_us == self._saved_commit_us
            or end_lsn > confirmed_lsn
            or self._table_missing
            or now - self._last_try < self.interval
        ):
            return
        self._last_try = now
        self.save(confirmed_lsn, commit_us)

    def save(self, confirmed_lsn: int, commit_us: int) -> None:
        table = checkpoint_table(self.settings)
        commit_time = datetime.fromtimestamp(commit_us / 1_000_000, tz=UTC)
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect_bounded(
                    database_dsn(self.settings),
                    statement_ms=STATEMENT_TIMEOUT_MS,
                    lock_ms=LOCK_TIMEOUT_MS,
                    timeout=side_write_timeout(self.settings.query_timeout, STATEMENT_TIMEOUT_MS),
                )
            self._conn.execute(
                f"INSERT INTO {table} AS c (slot, confirmed_lsn, commit_time, updated_at)"
                " VALUES (%s, %s::pg_lsn, %s, now()) ON CONFLICT (slot) DO UPDATE"
                " SET confirmed_lsn = greatest(c.confirmed_lsn, excluded.confirmed_lsn),"
                " commit_time = greatest(c.commit_time, excluded.commit_time), updated_at = now()",
                (self.settings.slot, format_lsn(confirmed_lsn), commit_time),
            )
        except psycopg.errors.UndefinedTable:
            self._table_missing = True
            log.warning(
                "the acknowledged position is not saved for `cdc recover`: run `cdc setup` to create %s",
                table,
            )
            return
        except (psycopg.Error, SourceConnectionError) as exc:
            log.warning(
                "could not save the acknowledged position (%s); trying again in %g s",
                first_line(exc),
                self.interval,
            )
            self.close()
            return
        self._saved_commit_us = commit_us
        self.saves += 1

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

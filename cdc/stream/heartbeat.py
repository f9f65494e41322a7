"""Heartbeats: keep the slot of a quiet outbox moving, and leave a trace that `cdc status` can read.

While the stream carries no changes for ``heartbeat_interval``, the pipeline writes a tiny non-transactional
logical message (prefix ``cdc-heartbeat``) into its own database on an ordinary connection. It comes back on
the stream like any change, so the slot has WAL of its own to confirm even when other databases on the
cluster write all the rest. When it comes back, the time is noted in the ``cdc_heartbeat`` table (one row
per slot, not published). Best effort throughout: a failure is a warning, retried at the next interval.

PostgreSQL 13's pgoutput cannot carry logical messages: the walsender reads the heartbeat and sends nothing.
There the heartbeat counts as back when a keepalive reports the server's WAL position at or past the
message's LSN, which says the same thing (the slot's decoding went through it), one keepalive later.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings
from cdc.errors import SourceConnectionError, first_line, parse_lsn
from cdc.pg import connect_bounded, database_dsn, side_write_timeout

log = logging.getLogger("cdc.heartbeat")

PREFIX = "cdc-heartbeat"
STATEMENT_TIMEOUT_MS = 5000
LOCK_TIMEOUT_MS = 2000

HEARTBEAT_TABLE = "cdc_heartbeat"


def heartbeat_table(settings: Settings) -> str:
    """The quoted name of the table where `cdc run` notes the heartbeats it saw, beside the outbox (made by
    `cdc setup`)."""
    return sql.Identifier(settings.table.schema, HEARTBEAT_TABLE).as_string()


class Heartbeat:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.interval = settings.heartbeat_interval
        self.seen = 0
        self.last_seen = 0.0  # Unix time the last heartbeat came back on the stream
        self._last_emitted = 0.0  # monotonic
        self._conn: psycopg.Connection[Any] | None = None
        self._table_missing = False
        # Set by the pipeline on PostgreSQL 13: follow the heartbeats by keepalive (see the module's text).
        self.by_keepalive = False
        self.awaiting_lsn: int | None = None

    def due(self, now: float, last_change: float) -> bool:
        """No change on the stream, and no heartbeat, for an interval (monotonic seconds)."""
        return now - last_change >= self.interval and now - self._last_emitted >= self.interval

    def emit(self, now: float) -> None:
        self._last_emitted = now
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect_bounded(
                    database_dsn(self.settings),
                    statement_ms=STATEMENT_TIMEOUT_MS,
                    lock_ms=LOCK_TIMEOUT_MS,
                    timeout=side_write_timeout(self.settings.query_timeout, STATEMENT_TIMEOUT_MS),
                )
            row = self._conn.execute(
                "SELECT pg_logical_emit_message(false, %s, now()::text)::text", (PREFIX,)
            ).fetchone()
            if self.by_keepalive and row is not None:
                self.awaiting_lsn = parse_lsn(row[0])
        except (psycopg.Error, SourceConnectionError) as exc:
            log.warning("heartbeat failed (%s); trying again in %g s", first_line(exc), self.interval)
            self.close()

    def keepalive(self, wal_end: int) -> None:
        """PostgreSQL 13: a keepalive at or past the heartbeat's LSN stands for the heartbeat itself."""
        awaiting = self.awaiting_lsn
        if awaiting is not None and wal_end >= awaiting:
            self.awaiting_lsn = None
            self.came_back()

    def came_back(self) -> None:
        """Our heartbeat was read back from the stream: count it and note it for `cdc status`."""
        self.seen += 1
        self.last_seen = time.time()
        conn = self._conn
        if conn is None or self._table_missing:
            return
        table = heartbeat_table(self.settings)
        try:
            conn.execute(
                f"INSERT INTO {table} (slot, seen_at) VALUES (%s, now())"
                " ON CONFLICT (slot) DO UPDATE SET seen_at = excluded.seen_at",
                (self.settings.slot,),
            )
        except psycopg.errors.UndefinedTable:
            self._table_missing = True
            log.warning("heartbeats are not noted for `cdc status`: run `cdc setup` to create %s", table)
        except psycopg.Error as exc:
            log.warning("could not note the heartbeat (%s)", first_line(exc))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

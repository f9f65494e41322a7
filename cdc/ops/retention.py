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

from cdc.config import Settings
from cdc.errors import ConfigError
from cdc.pg import DELETE_LOCKED, connect

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


def prune(settings: Settings, older_than: timedelta, *, batch_size: int = 10_000) -> int:
    """Delete outbox rows created more than ``older_than`` ago; returns how many were deleted."""
    created_at = settings.columns.created_at
    if created_at is None:
        raise ConfigError(
            "pruning needs the outbox's creation-time column: set columns.created_at (the debezium preset "
            "has none), or partition the table by time and drop old partitions instead",
            key="columns.created_at",
        )
    if batch_size < 1:
        raise ConfigError("--batch-size must be at least 1", key="batch_size")
    table = sql.Identifier(settings.table.schema, settings.table.name)
    statement = sql.SQL(
        "WITH old AS MATERIALIZED (SELECT tableoid AS rel, ctid AS tid FROM {table}"
        " WHERE {created_at} < now() - %s LIMIT %s FOR UPDATE SKIP LOCKED)"
        f" {DELETE_LOCKED}"
    ).format(table=table, created_at=sql.Identifier(created_at))
    total = 0
    with connect(settings.database_url) as conn:
        while True:
            deleted = _delete_batch(conn, statement, older_than, batch_size)
            total += deleted
            if deleted < batch_size:
                break
            log.debug("pruned %d rows so far", total)
    log.info("pruned %d outbox rows older than %s", total, older_than)
    return total


def _delete_batch(conn: psycopg.Connection[Any], statement: sql.Composed, older: timedelta, size: int) -> int:
    cursor = conn.execute(statement, (older, size))
    return cursor.rowcount

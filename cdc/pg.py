"""PostgreSQL helpers every wing may use: a connection whose failure never shows the DSN, and the batched
delete by ``(tableoid, ctid)`` of the prune commands (the outbox, ``processed_events``)."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc.errors import SourceConnectionError, first_line

# Deletes the rows of the CTE ``old`` (``rel``: tableoid, ``tid``: ctid), which the statement locked. A ctid
# names a row only within one partition: on a partitioned table (README, "Keeping the outbox small"), a
# ``ctid = ANY`` alone also matches the young rows of other partitions at the same ctids, so the partition is
# matched too. The ``ctid = ANY`` stays for its plan: a TID scan of each partition, where the planner may
# answer a join on ctid with a scan of the whole table.
DELETE_LOCKED = (
    "DELETE FROM {table} WHERE ctid = ANY (ARRAY(SELECT tid FROM old))"
    " AND (tableoid, ctid) IN (SELECT rel, tid FROM old)"
)


def connect_bounded(dsn: str, *, statement_ms: int, lock_ms: int) -> psycopg.Connection[Any]:
    """:func:`connect`, with every statement and lock wait bounded: for the pipeline's side writes (the
    heartbeat, the saved position), which run on the stream's only thread. A lock held on their table, or
    a server that hangs, must cost a warning, not the stream."""
    conn = connect(dsn)
    try:
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
            (f"{statement_ms}ms", f"{lock_ms}ms"),
        )
    except psycopg.Error:
        conn.close()
        raise
    return conn


def connect(dsn: str) -> psycopg.Connection[Any]:
    """An ordinary autocommit connection, its failure a SourceConnectionError."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SourceConnectionError(f"cannot connect to PostgreSQL: {first_line(exc)}") from exc

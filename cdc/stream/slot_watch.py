"""Other replication slots on the cluster: noticed when they come and go.

The role that streams needs the REPLICATION attribute, and with it a process can decode every table of the
database through a slot of its own, and drop any slot, ours too (docs/operations.md, "Least privilege").
PostgreSQL has no finer right. What can be done is to see it: every three ``status_interval`` (30 s by
default), on a side connection with bounded waits, `cdc run` reads ``pg_replication_slots`` and logs a
WARNING for each slot created or dropped since the last look (the first look only says what is there). The
count and the changes are metrics (``cdc_replication_slots``, ``cdc_replication_slot_changes_total``). Best
effort, like the heartbeat: a failed look is a debug line, and the next one compares with the last that
worked.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from cdc.config import Settings
from cdc.errors import SourceConnectionError, first_line
from cdc.pg import connect_bounded, database_dsn, side_write_timeout

log = logging.getLogger("cdc.slots")

STATEMENT_TIMEOUT_MS = 2000

Slot = tuple[str, str, str]  # (name, plugin or "physical", database or "")


def describe(slot: Slot) -> str:
    name, plugin, database = slot
    return f"{name} ({plugin}{', database ' + database if database else ''})"


class SlotWatch:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.interval = 3 * settings.status_interval  # between two looks at pg_replication_slots
        self.count: int | None = None  # slots on the cluster at the last look
        self.changes = 0  # slots created or dropped since the first look
        self._known: set[Slot] | None = None
        self._last_look = float("-inf")
        self._conn: psycopg.Connection[Any] | None = None

    def due(self, now: float) -> bool:
        return now - self._last_look >= self.interval

    def look(self, now: float) -> None:
        self._last_look = now
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect_bounded(
                    database_dsn(self.settings),
                    statement_ms=STATEMENT_TIMEOUT_MS,
                    lock_ms=STATEMENT_TIMEOUT_MS,
                    timeout=side_write_timeout(self.settings.query_timeout, STATEMENT_TIMEOUT_MS),
                )
            rows = self._conn.execute(
                "SELECT slot_name, coalesce(plugin, 'physical'), coalesce(database, '')"
                " FROM pg_replication_slots"
            ).fetchall()
        except (psycopg.Error, SourceConnectionError) as exc:
            log.debug("could not look at the replication slots: %s", first_line(exc))
            self.close()
            return
        self.seen({(str(n), str(p), str(d)) for n, p, d in rows})

    def seen(self, slots: set[Slot]) -> None:
        """Compare with the last look: a WARNING per slot created or dropped (pure; :meth:`look` reads)."""
        known, self._known, self.count = self._known, slots, len(slots)
        if known is None:
            others = sorted(describe(s) for s in slots if s[0] != self.settings.slot)
            log.info("replication slots on the cluster besides ours: %s", ", ".join(others) or "none")
            return
        for slot in sorted(slots - known):
            log.warning("replication slot %s was created on the cluster", describe(slot))
            self.changes += 1
        for slot in sorted(known - slots):
            ours = " (ours: the stream will stop)" if slot[0] == self.settings.slot else ""
            log.warning("replication slot %s was dropped%s", describe(slot), ours)
            self.changes += 1

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

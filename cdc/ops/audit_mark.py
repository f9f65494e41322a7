"""What clean `cdc audit` runs have covered, for `cdc outbox prune --audited`: ``audited_until`` and
``audited_xmin`` in ``cdc_checkpoint``.

An audit sees the outbox table through one snapshot. The row of a transaction still open then (running, or
prepared for two-phase commit) is invisible to it, whatever its ``created_at``; so is the row of a transaction
that had not written yet and whose ``created_at`` is older (``now()`` is when a transaction began, and an
application may set the column itself). A mark on ``created_at`` alone would cover such rows unseen, and a
prune would delete them, lost or not. So the audit keeps with the mark its snapshot's xmin: the oldest
transaction id still running in the cluster when it looked. Transaction ids are the cluster's, not a
database's, and a prepared transaction keeps its id until it ends, so this bound holds whatever runs where. A
row is **covered** when it was created before the mark AND written by a transaction older than that xmin,
which had ended when the audit looked: the audit saw it, if it committed. The others created before the mark
are **carried**: the next audit that joins the mark judges them whatever their ``created_at``, and reads the
topics from the oldest one's; `cdc outbox prune --audited` keeps them until then.

Why not the start of the oldest running transaction, less a slack: ``pg_stat_activity`` shows another role's
sessions only to members of ``pg_read_all_stats``, a prepared transaction records when it was prepared, not
when it began, and ``created_at`` is the application's clock, so any slack would be a guess. The xmin needs no
right and no clock. It is compared, never looked up: a row written under a savepoint carries its
subtransaction's id, which is above its parent's, so it counts as late as its transaction, as it must. A long
transaction anywhere in the cluster holds the xmin back: the rows written since it began are carried, and
judged once more by the next audit. That is a cost, never a gap.

The mark and its xmin change together, and only when the mark moves forward: then every row created before
the new mark by a transaction older than the new xmin was judged by this audit (created in its window), or
covered before (older than the old mark and xmin), or carried and judged now. A carried row that cannot be
judged yet (committed after the acknowledged position) stops the mark below the window, so it stays put.
A mark of an older version has no xmin: trusted as it was until the next clean audit records one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings
from cdc.errors import first_line
from cdc.stream.progress import CHECKPOINT_TABLE, read_position

log = logging.getLogger("cdc.audit")


def widen(xid: sql.Composable, after: sql.Composable) -> sql.Composable:
    """A row's 32-bit ``xid`` widened to its 64-bit id: the latest one with those low bits that is not
    ``after`` (a snapshot's next id, as bigint). Unfrozen rows are less than 2^31 transactions old, so this is
    exact for them; a frozen row keeps its raw id, and one older than 2^32 transactions would read as recent:
    carried and judged again, never skipped. 0 for the reserved ids (1 bootstrap, 2 frozen by an old
    server)."""
    return sql.SQL(
        "(CASE WHEN {x}::text::bigint < 3 THEN 0 ELSE greatest(({n} >> 32) - ({x}::text::bigint > ({n} & "
        "4294967295))::int, 0) * 4294967296 + {x}::text::bigint END)"
    ).format(x=xid, n=after)


# Relative to the statement's own snapshot: every row the statement sees was written before its next id.
FULL_XID = widen(sql.SQL("xmin"), sql.SQL("(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint)"))


def uncovered(xmin: int) -> tuple[sql.Composable, list[Any]]:
    """The condition on a row of the outbox table: written by a transaction no older than ``xmin``."""
    return sql.SQL("{} >= %s").format(FULL_XID), [xmin]


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What an audit's snapshot says of the mark, read in the transaction that chooses the rows."""

    before: datetime | None  # audited_until before this audit
    before_xmin: int | None  # its xmin (None: no mark yet, or one of an older version)
    xmin: int  # this audit's snapshot's
    joins: bool  # the window starts at or before the mark, or before every row: it may move the mark

    def carried(self, created: sql.Composable, since: datetime) -> tuple[sql.Composable, list[Any]] | None:
        """The rows created before the window that earlier audits did not see, or None."""
        if not self.joins or self.before is None or self.before_xmin is None:
            return None
        condition, params = uncovered(self.before_xmin)
        return sql.SQL("({} < %s AND {})").format(created, condition), [since, *params]


def scope(conn: psycopg.Connection[Any], settings: Settings, since: datetime) -> Scope:
    """Read in the audit's own snapshot (a repeatable-read transaction that also chooses the rows)."""
    saved = read_position(conn, settings)
    before = saved.audited_until if saved is not None else None
    table = sql.Identifier(settings.table.schema, settings.table.name)
    created = sql.Identifier(settings.columns.created_at or "created_at")
    row = conn.execute(
        sql.SQL(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, (SELECT min({}) FROM {})"
        ).format(created, table)
    ).fetchone()
    assert row is not None
    xmin, oldest = int(row[0]), row[1]
    joins = (before is not None and since <= before) or oldest is None or oldest >= since
    return Scope(
        before=before,
        before_xmin=saved.audited_xmin if saved is not None else None,
        xmin=xmin,
        joins=joins,
    )


def note(conn: psycopg.Connection[Any], settings: Settings, until: datetime, scope: Scope) -> datetime | None:
    """Move the mark to ``until`` with this audit's xmin, when it is ahead of the mark (another audit may
    have moved it meanwhile: the row's lock orders the two); the mark after it."""
    try:
        row = conn.execute(
            sql.SQL(
                "UPDATE {} SET audited_xmin = CASE WHEN audited_until IS NULL OR %(until)s > audited_until "
                "THEN %(xmin)s::text::xid8 ELSE audited_xmin END, "
                "audited_until = greatest(audited_until, %(until)s) WHERE slot = %(slot)s "
                "RETURNING audited_until"
            ).format(sql.Identifier(settings.table.schema, CHECKPOINT_TABLE)),
            {"until": until, "xmin": str(scope.xmin), "slot": settings.slot},
        ).fetchone()
    except psycopg.Error as exc:
        log.warning("audit: could not note audited_until (run `cdc setup`?): %s", first_line(exc))
        return scope.before
    return None if row is None else row[0]

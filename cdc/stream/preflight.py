"""Before streaming: the checks that make a refusal plain and touch nothing, on an ordinary connection
(``wal_level``, the role's right to stream, the slot, the publication, a recover that did not finish), and
the other ordinary-connection business of the stream's slot (its identity, ending our own silent
walsender, or the walsender of a pipeline that is gone).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.config import Settings
from cdc.errors import (
    PublicationError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotMissingError,
    SourceConnectionError,
    StartupRefusal,
    WalLevelError,
    parse_lsn,
)
from cdc.pg import DEFAULT_QUERY_TIMEOUT, connect, database_dsn
from cdc.stream import failover as failover_slots
from cdc.stream.identity import SlotIdentity
from cdc.stream.progress import check_not_recovering, read_position
from cdc.stream.source import quote_ident, scalar, server_identity

log = logging.getLogger("cdc.pipeline")

# How long a stale walsender that was ended is given to let go of the slot.
STALE_RELEASE_WAIT = 5.0


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """What the pre-flight checks found: the slot's positions and the server."""

    slot: str
    confirmed_flush_lsn: int
    restart_lsn: int
    wal_status: str | None
    server_version: int
    # A failover slot (PostgreSQL 17+), synchronized to the standbys that are set up for it.
    failover: bool = False
    # Where `cdc setup` or `cdc recover` created it (cdc_checkpoint); None for a slot of an older setup.
    created_lsn: int | None = None


# Managed services keep wal_level for themselves: each has a knob of its own, found by its own role.
_MANAGED_WAL_FIX = (
    (
        "rds_superuser",
        "Amazon RDS / Aurora: set rds.logical_replication = 1 in the DB parameter group, then reboot",
    ),
    (
        "cloudsqlsuperuser",
        "Cloud SQL: set the database flag cloudsql.logical_decoding = on (the instance restarts)",
    ),
    (
        "azure_pg_admin",
        "Azure Database for PostgreSQL: set the server parameter wal_level = logical, then restart",
    ),
)


def check_wal_level(conn: psycopg.Connection[Any]) -> None:
    """Refuse, with the fix, when the server cannot do logical decoding."""
    wal_level = scalar(conn, "SHOW wal_level")
    if wal_level != "logical":
        fix = "run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL (a reload is not enough)"
        for role, managed in _MANAGED_WAL_FIX:
            if scalar(conn, "SELECT to_regrole(%s) IS NOT NULL", (role,)):
                fix = managed
                break
        raise WalLevelError(
            f"PostgreSQL runs with wal_level = '{wal_level}', logical decoding needs 'logical'. Fix: {fix}"
        )


def check_may_stream(conn: psycopg.Connection[Any]) -> None:
    """Refuse, with the fix, a role that may not stream (Amazon RDS and Aurora give streaming through
    membership in their rds_replication role)."""
    user, may_stream, rds = conn.execute(
        "SELECT current_user, rolreplication OR rolsuper OR CASE WHEN to_regrole('rds_replication')"
        " IS NULL THEN false ELSE pg_has_role(current_user, 'rds_replication', 'MEMBER') END,"
        " to_regrole('rds_replication') IS NOT NULL FROM pg_roles WHERE rolname = current_user"
    ).fetchone() or ("?", False, False)
    if not may_stream:
        lacks, fix = (
            ("is not a member of rds_replication", f"GRANT rds_replication TO {quote_ident(user)}")
            if rds
            else ("lacks the REPLICATION attribute", f"ALTER ROLE {quote_ident(user)} REPLICATION")
        )
        raise StartupRefusal(
            f"role '{user}' may not stream: it {lacks}. Fix: {fix}; or connect as the role that "
            "`cdc setup --role` creates"
        )


@dataclass(frozen=True, slots=True)
class SlotRow:
    """What pg_replication_slots says of a slot that is fit to stream from."""

    confirmed: str | None
    restart: str | None
    wal_status: str | None
    failover: bool
    active_pid: int | None  # the walsender that holds it, when active


def check_slot(conn: psycopg.Connection[Any], slot: str) -> SlotRow:
    """Refuse a slot that is missing, of another kind or database, invalidated, or a standby's synchronized
    copy; the slot's row otherwise (whether another process holds it is the caller's question)."""
    server_version = conn.info.server_version
    dbname = conn.info.dbname
    # PostgreSQL 17 names why a slot was invalidated, marks failover slots, and the copies of them that a
    # standby keeps in sync (which cannot be streamed from before a promotion).
    extra = (
        ", invalidation_reason, failover, synced AND pg_is_in_recovery()"
        if server_version >= 170000
        else ", NULL, false, false"
    )
    row = conn.execute(
        "SELECT plugin, slot_type, database, active, active_pid, wal_status,"
        f" confirmed_flush_lsn::text, restart_lsn::text{extra}"
        " FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise SlotMissingError(
            f"replication slot '{slot}' does not exist. A first start: create it with `cdc setup`. "
            "A lost slot: run `cdc recover`, which republishes from the outbox table what the old one "
            "had not delivered and re-creates it. It is never created automatically, because a new slot "
            "starts at the current WAL position and would skip every event committed since the old one "
            "was lost"
        )
    (
        plugin,
        slot_type,
        database,
        active,
        active_pid,
        wal_status,
        confirmed,
        restart,
        reason,
        failover,
        synced_copy,
    ) = row
    if slot_type != "logical" or plugin != "pgoutput":
        raise StartupRefusal(
            f"replication slot '{slot}' is a {slot_type} slot of plugin {plugin!r}; "
            "outbox CDC needs a logical slot of plugin 'pgoutput'"
        )
    if database != dbname:
        raise StartupRefusal(
            f"replication slot '{slot}' belongs to database '{database}', "
            f"but the pipeline connects to '{dbname}': fix database_url or slot"
        )
    if wal_status == "lost" or restart is None or reason is not None:
        why = f"invalidation_reason = {reason}" if reason else "wal_status = lost"
        raise SlotInvalidatedError(
            f"replication slot '{slot}' was invalidated by PostgreSQL ({why}): the changes it "
            f"held are gone and events may be missing (confirmed LSN {confirmed or 'unknown'}). Run "
            "`cdc recover`: it republishes from the outbox table what the slot had not delivered and "
            "re-creates it"
        )
    if synced_copy:
        raise SourceConnectionError(
            f"the server is a standby and slot '{slot}' is its synchronized copy of the primary's, "
            "which cannot be streamed from before a promotion. "
            "Connect to the primary (a multi-host database_url with target_session_attrs=read-write "
            "follows a promotion)"
        )
    return SlotRow(confirmed, restart, wal_status, bool(failover), active_pid if active else None)


def slot_in_use(slot: str, pid: int) -> SlotActiveError:
    return SlotActiveError(
        f"replication slot '{slot}' is in use by another process (pid {pid}); "
        "only one pipeline may stream from a slot. Stop the other one first",
        pid=pid,
    )


def check_publication(conn: psycopg.Connection[Any], publication: str, table: tuple[str, str]) -> None:
    """Refuse a publication that is missing, or does not publish the outbox table's inserts under its own
    name."""
    if scalar(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (publication,)) == 0:
        raise PublicationError(f"publication '{publication}' does not exist; create it with `cdc setup`")
    via_root = scalar(
        conn,
        "SELECT p.pubviaroot FROM pg_publication p, pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s AND n.nspname = %s"
        " AND c.relname = %s AND c.relkind = 'p'",
        (publication, table[0], table[1]),
    )
    if via_root is False:
        raise PublicationError(
            f"{table[0]}.{table[1]} is partitioned, and publication '{publication}' publishes its "
            "inserts under the partitions' names, which the pipeline does not know. Fix: ALTER "
            f"PUBLICATION {quote_ident(publication)} SET (publish_via_partition_root = true); "
            "(`cdc setup` does it)"
        )
    covered = scalar(
        conn,
        "SELECT count(*) FROM pg_publication_tables t JOIN pg_publication p ON p.pubname = t.pubname "
        "WHERE t.pubname = %s AND t.schemaname = %s AND t.tablename = %s AND p.pubinsert",
        (publication, table[0], table[1]),
    )
    if covered == 0:
        raise PublicationError(
            f"publication '{publication}' does not publish inserts of {table[0]}.{table[1]}. Fix: "
            f"ALTER PUBLICATION {quote_ident(publication)} ADD TABLE {quote_ident(table[0])}."
            f"{quote_ident(table[1])}, or correct the 'table' setting"
        )


def preflight(
    dsn: str,
    *,
    slot: str,
    publication: str,
    table: tuple[str, str],
    check_failover: bool = False,
    checkpoint_table: str | None = None,
    timeout: float | None = None,
    silence: float | None = None,
) -> SlotInfo:
    """Refuse plainly, before streaming, when the database cannot stream the outbox safely. With
    ``checkpoint_table``, also when a `cdc recover` of the slot did not finish. ``timeout``: each wait for
    the server (query_timeout). With ``silence`` (source_silence_timeout), a walsender of our own role that
    holds the slot and has heard nothing from its client for longer is ended rather than refused."""
    with connect(dsn, timeout=timeout or DEFAULT_QUERY_TIMEOUT) as conn:
        server_version = conn.info.server_version
        check_wal_level(conn)
        check_may_stream(conn)
        found = check_slot(conn, slot)
        active_pid = found.active_pid
        if (
            active_pid is not None
            and silence is not None
            and _end_stale_walsender(conn, slot, active_pid, silence)
        ):
            active_pid = None
        if active_pid is not None:
            raise slot_in_use(slot, active_pid)
        created_lsn = None
        if checkpoint_table is not None:
            saved = check_not_recovering(conn, checkpoint_table, slot)
            created_lsn = None if saved is None else saved.slot_created_lsn
        check_publication(conn, publication, table)
        if check_failover:
            failover_slots.warn_at_start(conn, dsn, slot)
    return SlotInfo(
        slot=slot,
        confirmed_flush_lsn=parse_lsn(found.confirmed) if found.confirmed else 0,
        restart_lsn=parse_lsn(found.restart) if found.restart else 0,
        wal_status=found.wal_status,
        server_version=server_version,
        failover=found.failover,
        created_lsn=created_lsn,
    )


def _end_stale_walsender(conn: psycopg.Connection[Any], slot: str, pid: int, silence: float) -> bool:
    """The slot is held by walsender ``pid``. A live pipeline's client sends it a status update every
    status_interval (below ``silence``, waits included); one that has sent nothing for longer than
    ``silence`` belongs to a pipeline that is gone (killed, or its connection frozen), which the server would
    only notice at wal_sender_timeout. Watch it for up to ``silence``: when its client speaks, it is alive
    (False: refuse); when it stays silent past ``silence`` and is our own role's, end it and wait (bounded)
    for the slot to be free (True)."""
    deadline = time.monotonic() + silence + 1
    last_quiet: float | None = None
    while True:
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - coalesce(reply_time, backend_start))::float8,"
            " usename = current_user FROM pg_stat_replication WHERE pid = %s",
            (pid,),
        ).fetchone()
        if row is None:  # gone meanwhile
            return not scalar(conn, "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        quiet, own = float(row[0] or 0.0), bool(row[1])
        if not own or (last_quiet is not None and quiet < last_quiet):
            return False  # another role's, or its client spoke: alive
        if quiet > silence:
            break
        if time.monotonic() > deadline:
            return False
        last_quiet = quiet
        time.sleep(min(0.5, silence - quiet + 0.05))
    if not scalar(conn, "SELECT pg_terminate_backend(%s)", (pid,)):
        return False
    release = time.monotonic() + STALE_RELEASE_WAIT
    while scalar(conn, "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)):
        if time.monotonic() > release:
            return False
        time.sleep(0.1)
    log.warning(
        "replication slot '%s' was held by walsender pid %d, whose client had sent nothing for %.0f s "
        "(source_silence_timeout = %g s): a pipeline that is gone (killed, or its connection frozen). "
        "Ended it to take the slot over",
        slot,
        pid,
        quiet,
        silence,
    )
    return True


def end_own_walsender(settings: Settings, pid: int) -> bool:
    """Our own last connection's walsender ``pid`` went silent (the network froze it, so the server does not
    know it is gone): end it rather than wait for wal_sender_timeout. True when it was ended."""
    try:
        ended = end_walsender(database_dsn(settings), pid, settings.query_timeout)
    except (SourceConnectionError, psycopg.Error) as failure:
        log.warning("could not end our silent walsender (pid %d): %s", pid, failure)
        return False
    if ended:
        log.warning("ended our previous walsender (pid %d), silent since its connection froze", pid)
    return ended


def end_walsender(dsn: str, pid: int, timeout: float) -> bool:
    """Terminate our own walsender of a connection that went silent: the server would keep it, and the
    slot with it, until wal_sender_timeout. A role may end its own backends. True when it was ended."""
    with connect(dsn, timeout=timeout) as conn:
        row = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE pid = %s", (pid,)
        ).fetchone()
    return bool(row and row[0])


def slot_identity(settings: Settings) -> SlotIdentity:
    """The slot's identity as `cdc run` keys its exactly-once checkpoint: the server's system identifier,
    the slot's name, and where `cdc setup` or `cdc recover` created it."""
    server = server_identity(database_dsn(settings), settings.query_timeout)
    with connect(database_dsn(settings), timeout=settings.query_timeout) as conn:
        saved = read_position(conn, settings)
    return SlotIdentity(server.system_id, settings.slot, None if saved is None else saved.slot_created_lsn)

"""`cdc setup`: render the SQL scripts of ``cdc/slot_setup/`` (package data) with the configured names and
apply them.

The scripts are numbered and idempotent, so ``cdc setup`` may run on every deploy. Before anything, the
server is checked for what logical decoding needs, and the fix is spelled out when it is missing.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc.config import Settings
from cdc.errors import CdcError, ConfigError, StartupRefusal
from cdc.pg import connect, database_dsn, tracks_commit_timestamps
from cdc.stream.heartbeat import HEARTBEAT_TABLE, heartbeat_table
from cdc.stream.preflight import check_wal_level
from cdc.stream.progress import CHECKPOINT_TABLE, checkpoint_table, read_position

log = logging.getLogger("cdc.setup")

# Package data (pyproject.toml): in a checkout, an editable install and a wheel alike.
SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "slot_setup"
_WHEN = re.compile(r"--\s*when:(\w+)\s*$")
_MARKER = re.compile(r"\{\{(\w+)\}\}")
# Roles are named like the other settings' identifiers (cdc.config): ASCII, no `$` (the role goes inside the
# `$$`-quoted DO body of 07_role.sql), no quote or space, and short enough not to be truncated by PostgreSQL.
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True, slots=True)
class SetupStep:
    name: str
    sql: str


def script_dir() -> Path:
    """The SQL scripts, shipped inside the package (cdc/slot_setup/)."""
    if not any(SCRIPTS_DIR.glob("*.sql")):
        raise CdcError(
            f"the SQL scripts of `cdc setup` are missing from {SCRIPTS_DIR}: the installation of outbox-cdc "
            "is incomplete. Reinstall it (pip install --force-reinstall outbox-cdc)"
        )
    return SCRIPTS_DIR


def _ident(*names: str) -> str:
    return sql.Identifier(*names).as_string()


def _literal(value: str) -> str:
    return sql.Literal(value).as_string()


def check_role(role: str) -> None:
    """Refuse a ``--role`` that is not a plain identifier, before anything is sent to the server."""
    if not _ROLE.fullmatch(role):
        raise ConfigError(
            f"--role {role!r} is not a plain role name: use letters, digits and _ (starting with a letter or "
            "_, at most 63 characters), e.g. --role cdc_stream",
            key="role",
        )


def _check_names(settings: Settings) -> None:
    # load_settings already refuses these, but Settings built in code skip it. A `$` is the one character
    # quoting does not neutralize: inside the scripts' `$$` bodies (DO blocks, functions) a `$$` in a name
    # would end the body and run the rest of the name as SQL.
    names = {
        "table": f"{settings.table.schema}.{settings.table.name}",
        "publication": settings.publication,
        "slot": settings.slot,
        **{
            f"columns.{field}": name for field, name in settings.columns.as_dict().items() if name is not None
        },
    }
    for key, name in names.items():
        if "$" in name:
            raise ConfigError(
                f"setting {key!r} {name!r} has a '$', which cdc setup cannot put in its $$-quoted SQL: "
                "rename it without '$'",
                key=key,
            )


def render(
    settings: Settings, directory: Path | None = None, *, role: str | None = None, failover: bool = False
) -> list[SetupStep]:
    """The scripts with every ``{{marker}}`` filled in, in their numbered order. A script whose first line
    is ``-- requires: role`` is only applied with a role."""
    if role is not None:
        check_role(role)
    _check_names(settings)
    columns = settings.columns.as_dict()
    schema, name = settings.table.schema, settings.table.name
    values: dict[str, str] = {
        "table": _ident(schema, name),
        "publication": _ident(settings.publication),
        "publication_literal": _literal(settings.publication),
        "table_literal": _literal(_ident(schema, name)),
        "slot_literal": _literal(settings.slot),
        "schema": _ident(schema),
        "heartbeat_table": heartbeat_table(settings),
        "checkpoint_table": checkpoint_table(settings),
        "failover_arguments": ", false, false, true" if failover else "",
        "index_created_at": _ident(f"{name}_created_at_idx"),
        "function_emit": _ident(schema, f"{name}_emit"),
        "function_emit_message": _ident(schema, f"{name}_emit_message"),
    }
    values.update({f"col_{field}": _ident(column) for field, column in columns.items() if column is not None})
    steps = []
    if role is not None:
        values.update(role=_ident(role), role_literal=_literal(role))
    for path in sorted((directory or script_dir()).glob("*.sql")):
        text = path.read_text()
        if text.startswith("-- requires: role") and role is None:
            continue
        lines = []
        for line in text.splitlines():
            when = _WHEN.search(line)
            if when and columns.get(when.group(1)) is None:
                continue
            lines.append(_MARKER.sub(partial(_fill, values=values, path=path), line))
        steps.append(SetupStep(path.name, "\n".join(lines) + "\n"))
    return steps


def _fill(match: re.Match[str], *, values: dict[str, str], path: Path) -> str:
    try:
        return values[match.group(1)]
    except KeyError:
        raise CdcError(f"{path.name}: unknown marker {{{{{match.group(1)}}}}}") from None


def warn_without_commit_timestamps(conn: psycopg.Connection[Any]) -> None:
    """`cdc recover` chooses what a lost slot may not have delivered by commit time: without it, only by
    created_at, which it cannot vouch for. Not a refusal: the pipeline itself does not need it."""
    if not tracks_commit_timestamps(conn):
        log.warning(
            "track_commit_timestamp is off: should the slot ever be lost, `cdc recover` can choose the rows "
            "to republish only by created_at, and refuses without --accept-gap. Fix: ALTER SYSTEM SET "
            "track_commit_timestamp = on; then restart PostgreSQL"
        )


def check_capacity(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """A new slot needs a free replication slot, and streaming a free WAL sender: say so before creating."""
    row = conn.execute(
        "SELECT current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots),"
        " current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication),"
        " EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)",
        (settings.slot,),
    ).fetchone()
    assert row is not None
    max_slots, slots, max_senders, senders, ours = row
    if not ours and slots >= max_slots:
        raise StartupRefusal(
            f"no free replication slot ({slots} of max_replication_slots = {max_slots} in use). Run "
            f"ALTER SYSTEM SET max_replication_slots = {max_slots + 4}; then restart PostgreSQL, or drop an "
            "unused slot"
        )
    if senders >= max_senders:
        raise StartupRefusal(
            f"no free WAL sender ({senders} of max_wal_senders = {max_senders} in use). Run "
            f"ALTER SYSTEM SET max_wal_senders = {max_senders + 4}; then restart PostgreSQL"
        )


def apply(
    settings: Settings, *, dry_run: bool = False, role: str | None = None, failover: bool = False
) -> list[tuple[str, str]]:
    """Apply the scripts; returns (script, outcome) pairs. With ``dry_run``, nothing is sent to the server.
    With ``role``, also create (or fix) a least-privilege role for ``cdc run``; with ``failover``, create
    the slot as a failover slot (PostgreSQL 17+)."""
    steps = render(settings, role=role, failover=failover)
    if dry_run:
        return [(step.name, step.sql) for step in steps]
    outcomes = []
    with connect(database_dsn(settings), timeout=settings.query_timeout) as conn:
        check_wal_level(conn)
        warn_without_commit_timestamps(conn)
        check_capacity(conn, settings)
        if failover and conn.info.server_version < 170000:
            major = conn.info.server_version // 10000
            raise StartupRefusal(
                f"failover slots need PostgreSQL 17 or later; this server is {major}. Leave out --failover, "
                "or upgrade"
            )
        _refuse_a_lost_slot(conn, settings)
        for step in steps:
            before = _objects(conn, settings, role)
            try:
                conn.execute(step.sql.encode())
            except psycopg.Error as exc:
                raise CdcError(f"{step.name} failed: {exc.diag.message_primary or exc}") from exc
            after = _objects(conn, settings, role)
            created = sorted(k for k, present in after.items() if present and not before[k])
            outcome = f"created {', '.join(created)}" if created else "already present"
            log.debug("setup %s: %s", step.name, outcome)
            outcomes.append((step.name, outcome))
    return outcomes


def _refuse_a_lost_slot(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """A missing slot that `cdc run` saved a position for was lost, not never made: a new one at the current
    position would skip what it had not delivered. That is `cdc recover`'s job, not setup's."""
    slot = conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)
    ).fetchone()
    if slot is not None:
        return
    saved = read_position(conn, settings)
    if saved is not None:
        raise StartupRefusal(
            f"replication slot '{settings.slot}' is missing, but `cdc run` streamed from it (position saved "
            f"{saved.updated_at.isoformat(timespec='seconds')}): it was lost, and a new slot made here would "
            "skip what it had not delivered. Run `cdc recover`; or, to start afresh without republishing, "
            "`cdc teardown` first"
        )


def _objects(conn: psycopg.Connection[Any], settings: Settings, role: str | None) -> dict[str, bool]:
    schema, name = settings.table.schema, settings.table.name
    functions = "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL,"
        " EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s),"
        " EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s),"
        f" EXISTS ({functions} AND p.proname = %s), EXISTS ({functions} AND p.proname = %s),"
        " to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (
            _ident(schema, name),
            settings.publication,
            settings.slot,
            schema,
            f"{name}_emit",
            schema,
            f"{name}_emit_message",
            heartbeat_table(settings),
            checkpoint_table(settings),
        ),
    ).fetchone()
    assert row is not None
    roles = {}
    if role is not None:
        found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        roles[f"role {role}"] = found is not None
    return {
        **roles,
        f"table {settings.table}": bool(row[0]),
        f"publication {settings.publication}": bool(row[1]),
        f"slot {settings.slot}": bool(row[2]),
        f"function {schema}.{name}_emit": bool(row[3]),
        f"function {schema}.{name}_emit_message": bool(row[4]),
        f"table {schema}.{HEARTBEAT_TABLE}": bool(row[5]),
        f"table {schema}.{CHECKPOINT_TABLE}": bool(row[6]),
    }

"""`cdc check`: would `cdc run` start? Every problem at once, and nothing changed.

It asks what `cdc run` asks at its start, with the same code (:mod:`cdc.stream.preflight`,
:mod:`cdc.stream.progress`, :mod:`cdc.stream.access`, :mod:`cdc.ops.setup`), but goes on past the first
problem, and asks a little more than the start does (the replication connection, the role's rights on the
bookkeeping tables, the outbox table's columns against ``columns``, the rights on the topics it knows, the
replication factor against the cluster):

- the configuration (loading it is the CLI's: a setting refused there is the one line and exit 2) and
  ``fast_path``; the schemas, as `cdc run` loads them (an empty ``schemas_dir`` is a warning: every event
  would be dead-lettered);
- PostgreSQL (:func:`check_postgresql`); Kafka and the registry (:mod:`cdc.ops.check_kafka`).

Each finding is ``ok``, ``warn`` or ``fail``; a failure carries the exit code of the error `cdc run` would
stop with, and the report's exit code is the highest of them (docs/design.md, "Exit codes": 2 when a setting,
a right or a server object must be fixed, 1 when an outage explains it), 0 when `cdc run` would start.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc import fastpath
from cdc.avro.reload import load
from cdc.config import Settings, describe_dsn
from cdc.errors import ConfigError, SourceConnectionError, StartupRefusal
from cdc.ops.check_kafka import check_kafka, check_registry
from cdc.ops.check_report import CheckReport
from cdc.ops.setup import check_capacity
from cdc.pg import access_refusal, connect, database_dsn, tracks_commit_timestamps
from cdc.stream.heartbeat import heartbeat_table
from cdc.stream.messages import Column, Relation
from cdc.stream.preflight import check_may_stream, check_publication, check_slot, check_wal_level, slot_in_use
from cdc.stream.progress import (
    check_not_recovering,
    checkpoint_table,
    partitioner_change,
    published_with,
    read_position,
)
from cdc.stream.route import EventRouter
from cdc.stream.source import quote_ident, server_identity

__all__ = ["CheckReport", "run_checks"]


def run_checks(settings: Settings) -> CheckReport:
    """Every check, in the order `cdc run` meets them; nothing is created, written or taken over."""
    report = CheckReport()
    check_configuration(settings, report)
    check_schemas(settings, report)
    check_postgresql(settings, report)
    check_kafka(settings, report)
    check_registry(settings, report)
    return report


def check_configuration(s: Settings, report: CheckReport) -> None:
    files = sorted({w.removeprefix("in ") for w in s.sources.values() if w.startswith("in ")})
    variables = sum(w.startswith("from CDC_") for w in s.sources.values())
    origin = ", ".join([*files, f"{variables} CDC_* variable(s)"])
    report.ok(
        "configuration",
        f"read ({origin}): database {describe_dsn(s.database_url)}, slot {s.slot}, publication "
        f"{s.publication}, table {s.table}, kafka {s.kafka.bootstrap_servers}, delivery {s.delivery}",
    )
    with report.step("configuration"):
        fastpath.enabled(s.fast_path)  # fast_path = "required" without the extension: cdc run's refusal


def check_schemas(s: Settings, report: CheckReport) -> None:
    found = load(s.schemas_dir, s.schema_compatibility, compiled=False)
    if isinstance(found, list):
        for problem in found:
            report.fail("schemas", ConfigError(f"setting 'schemas_dir': {problem}", key="schemas_dir"))
        return
    types = sorted({event_type for event_type, _ in found.schemas})
    report.event_types = types
    if not types:
        report.warn(
            "schemas",
            f"{s.schemas_dir.absolute()} holds no schema: every event would be dead-lettered "
            "(schema_not_found). Add <event_type>/v1.avsc files first",
        )
        return
    report.ok(
        "schemas",
        f"{len(found.schemas)} version(s) of {len(types)} event type(s) in {s.schemas_dir} "
        f"({s.schema_compatibility})",
    )


def check_postgresql(s: Settings, report: CheckReport) -> None:
    area = "postgresql"
    try:
        dsn = database_dsn(s)
        conn = connect(dsn, timeout=s.query_timeout)
    except SourceConnectionError as exc:
        report.fail(area, access_refusal(exc) or exc)
        return
    with conn:
        row = conn.execute("SELECT current_user").fetchone()
        user = str(row[0]) if row else "?"
        report.ok(area, f"connected as {user} (PostgreSQL {conn.info.server_version // 10000})")
        with report.step(area, "wal_level = logical"):
            check_wal_level(conn)
        with report.step(area, f"role {user} may stream"):
            check_may_stream(conn)
        if tracks_commit_timestamps(conn):
            report.ok(area, "track_commit_timestamp = on")
        else:
            report.warn(
                area,
                "track_commit_timestamp is off: `cdc recover` and `cdc audit` need it (ALTER SYSTEM SET "
                "track_commit_timestamp = on; then restart PostgreSQL)",
            )
        _slot(conn, s, report)
        with report.step(area, f"publication {s.publication} publishes the inserts of {s.table}"):
            check_publication(conn, s.publication, (s.table.schema, s.table.name))
        with report.step(area, f"table {s.table} has the columns that 'columns' names"):
            _columns(conn, s)
        with report.step(area):
            check_capacity(conn, s)
        with report.step(area):
            _bookkeeping_rights(conn, s, report)
    with report.step(area, "a replication connection is accepted (pg_hba.conf)"):
        try:
            server_identity(dsn, s.query_timeout)  # the replication connection: pg_hba's `replication` lines
        except SourceConnectionError as exc:
            raise access_refusal(exc) or exc from exc


def _slot(conn: psycopg.Connection[Any], s: Settings, report: CheckReport) -> None:
    area = "postgresql"
    with report.step(area):
        found = check_slot(conn, s.slot)
        if found.active_pid is not None and s.on_slot_active == "wait":
            report.ok(area, f"slot {s.slot} is streamed by pid {found.active_pid}: `cdc run` would stand by")
        elif found.active_pid is not None:
            # Not a failure: a deploy checks while the running version holds the slot, and stops it first.
            report.warn(area, f"{slot_in_use(s.slot, found.active_pid)} (a deploy stops it before it starts)")
        else:
            report.ok(area, f"slot {s.slot} (confirmed {found.confirmed})")
    with report.step(area):
        check_not_recovering(conn, checkpoint_table(s), s.slot)
        used = published_with(read_position(conn, s))
        if used not in (None, s.partitioner):
            raise partitioner_change(s, str(used))


def _columns(conn: psycopg.Connection[Any], s: Settings) -> None:
    """The outbox table's columns against ``columns``, as the stream's first Relation message is read."""
    table = sql.Identifier(s.table.schema, s.table.name).as_string()
    rows = conn.execute(
        "SELECT attname, atttypid::int, atttypmod FROM pg_attribute WHERE attrelid = to_regclass(%s)"
        " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    if not rows:
        raise ConfigError(
            f"the outbox table {s.table} does not exist: create it with `cdc setup`", key="table"
        )
    columns = tuple(Column(name, type_oid, modifier, False) for name, type_oid, modifier in rows)
    EventRouter(s).relation(Relation(0, s.table.schema, s.table.name, "d", columns))


def _bookkeeping_rights(conn: psycopg.Connection[Any], s: Settings, report: CheckReport) -> None:
    """What `cdc run` writes beside the stream: its saved position (refused to start without the rights) and
    its heartbeats (warned about at each one)."""
    user = quote_ident(str((conn.execute("SELECT current_user").fetchone() or ("?",))[0]))
    for table, needed in ((checkpoint_table(s), True), (heartbeat_table(s), False)):
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if not (row and row[0]):
            report.warn("postgresql", f"table {table} does not exist: run `cdc setup`")
            continue
        lacks = [
            p
            for p in ("SELECT", "INSERT", "UPDATE")
            if not (conn.execute("SELECT has_table_privilege(%s, %s)", (table, p)).fetchone() or (False,))[0]
        ]
        if not lacks:
            report.ok("postgresql", f"role {user} may read and write {table}")
            continue
        grant = f"GRANT {', '.join(lacks)} ON {table} TO {user}"
        if needed:
            report.fail(
                "postgresql",
                StartupRefusal(
                    f"role {user} lacks {', '.join(lacks)} on {table}, where `cdc run` saves its position: "
                    f"{grant} (`cdc setup --role` grants it)"
                ),
            )
        else:
            report.warn(
                "postgresql", f"role {user} lacks {', '.join(lacks)} on {table}: heartbeats fail. {grant}"
            )

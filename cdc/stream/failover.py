"""Failover slots (PostgreSQL 17+): is the slot ready to survive a promotion of the standby?

A slot created with ``failover = true`` (`cdc setup --failover`) is copied to a physical standby that runs
with ``sync_replication_slots = on`` (plus ``hot_standby_feedback = on`` and a ``primary_slot_name``). The
primary must also list that standby's physical slot in ``synchronized_standby_slots``: then its walsender
hands a logical change to `cdc run` only once the standby has the WAL for it, so the synchronized slot can
never be ahead of what the standby holds. Without it the slot works, but a promotion can lose the slot or
events.

`cdc run` says at start what is missing (warnings, never a refusal: the stream is fine until a failover),
and `cdc status` shows the same. When ``database_url`` names several hosts, the standby among them is asked
too (``target_session_attrs=standby``): whether it is set up to sync, and whether the slot is there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.errors import first_line
from cdc.pg import DEFAULT_QUERY_TIMEOUT, BoundedConnection, silence_params

log = logging.getLogger("cdc.failover")

STANDBY_CONNECT_TIMEOUT = 3


@dataclass(frozen=True, slots=True)
class FailoverReadiness:
    """``failover``: the slot is a failover slot. ``synced_on_standby``: the standby of ``database_url``
    holds the slot, synchronized and persistent, so that it survives a promotion (None: no standby was
    reachable there). ``problems``: what would make a promotion lose the slot or events, each with its
    fix."""

    failover: bool
    synced_on_standby: bool | None = None
    problems: list[str] = field(default_factory=list)


def several_hosts(dsn: str) -> bool:
    return "," in str(conninfo_to_dict(dsn).get("host") or "")


def check(conn: psycopg.Connection[Any], dsn: str, slot: str) -> FailoverReadiness | None:
    """What the primary (``conn``) and the standby of ``dsn`` say about ``slot``; None before PostgreSQL 17
    (no failover slots) or when the slot is missing."""
    if conn.info.server_version < 170000:
        return None
    row = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    if not row[0]:
        problems = []
        if several_hosts(dsn):
            problems.append(
                f"slot '{slot}' is not a failover slot, so a promotion of the standby loses it. Fix: "
                "re-create it with `cdc setup --failover` (PostgreSQL 17+)"
            )
        return FailoverReadiness(failover=False, problems=problems)
    problems = _primary_problems(conn)
    synced = None
    if several_hosts(dsn):
        synced, standby_problems = _ask_standby(dsn, slot)
        problems += standby_problems
    return FailoverReadiness(failover=True, synced_on_standby=synced, problems=problems)


def _primary_problems(conn: psycopg.Connection[Any]) -> list[str]:
    setting = conn.execute("SELECT current_setting('synchronized_standby_slots')").fetchone()
    names = [n.strip() for n in (setting[0] if setting else "").split(",") if n.strip()]
    if not names:
        return [
            "synchronized_standby_slots is empty on the primary: changes can reach Kafka before the standby "
            "has them, and after a promotion the synchronized slot may be missing or behind them. Fix: ALTER "
            "SYSTEM SET synchronized_standby_slots = '<the standby's physical slot>'; SELECT pg_reload_conf()"
        ]
    problems = []
    for name in names:
        physical = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s AND slot_type = 'physical'", (name,)
        ).fetchone()
        if physical is None:
            problems.append(
                f"synchronized_standby_slots names '{name}', which is no physical slot on the primary: the "
                "pipeline's walsender waits for it. Fix: create it (pg_create_physical_replication_slot) "
                "for the standby, or correct the setting"
            )
        elif not physical[0]:
            problems.append(
                f"the standby of physical slot '{name}' is not connected: the pipeline's walsender waits "
                "until it is (synchronized_standby_slots)"
            )
    return problems


def _ask_standby(dsn: str, slot: str) -> tuple[bool | None, list[str]]:
    standby_dsn = make_conninfo(
        dsn, target_session_attrs="standby", connect_timeout=str(STANDBY_CONNECT_TIMEOUT)
    )
    try:
        with BoundedConnection.connect(
            standby_dsn, autocommit=True, **silence_params(standby_dsn, DEFAULT_QUERY_TIMEOUT)
        ) as standby:
            settings = standby.execute(
                "SELECT current_setting('sync_replication_slots'), current_setting('hot_standby_feedback'),"
                " current_setting('primary_slot_name')"
            ).fetchone()
            row = standby.execute(
                "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
    except psycopg.Error as exc:
        return None, [f"no standby among the hosts of database_url answers ({first_line(exc)})"]
    assert settings is not None
    sync, feedback, primary_slot = settings
    problems = []
    if sync != "on":
        problems.append("the standby runs with sync_replication_slots = off, so it copies no slot: set it on")
    if feedback != "on":
        problems.append("the standby runs with hot_standby_feedback = off, which slot synchronization needs")
    if not primary_slot:
        problems.append("the standby has no primary_slot_name, which slot synchronization needs")
    # Not synchronized yet is no problem of configuration: the standby's slot sync worker copies a new
    # slot once the primary's has moved; `cdc status` shows it as synced_on_standby = false meanwhile.
    return row is not None and bool(row[0]), problems


def warn_at_start(conn: psycopg.Connection[Any], dsn: str, slot: str) -> None:
    """`cdc run`: one warning per problem, never a refusal."""
    try:
        readiness = check(conn, dsn, slot)
    except psycopg.Error as exc:
        log.warning("could not check whether slot %s survives a failover: %s", slot, first_line(exc))
        return
    for problem in readiness.problems if readiness else []:
        log.warning("failover: %s", problem)

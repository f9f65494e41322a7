"""`cdc audit` at the end of a fault run, against the suite's own checker (tests/faults/check.py), then once
more with a transaction open across it (:func:`open_across_audit`).

The audit judges the rows of its window (by default up to the slot's last saved acknowledged position, which
`cdc run` writes every ``status_interval``: the last seconds of a run may fall after it). So the checker's
missing ids are narrowed to the same window, with the same conditions, before the two are compared: each
must name exactly the other's ids, and the audit must exit 1 when there are any, 0 when none.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.children import dying_with_parent
from tests.faults.load import EVENT_TYPE
from tests.faults.supervisor import start_cdc_run

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AuditCheck:
    code: int
    missing: list[str]  # the audit's
    expected_missing: list[str]  # the checker's, within the audit's window
    text: str

    @property
    def agrees(self) -> bool:
        right_code = self.code == (1 if self.expected_missing else 0)
        return right_code and sorted(self.missing) == sorted(self.expected_missing)

    def figure(self) -> str:
        return f"audit_missing={len(self.missing)} audit_agrees={'yes' if self.agrees else 'NO'}"


def run_audit(
    env: dict[str, str], since: datetime, checker_missing: list[str], dsn: str, table: str
) -> AuditCheck:
    done = subprocess.run(
        dying_with_parent([sys.executable, "-m", "cdc", "audit", "--since", since.isoformat(), "--json"]),
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        body = json.loads(done.stdout)
    except ValueError:
        return AuditCheck(done.returncode, [], checker_missing, f"no report: {done.stderr.strip()[-500:]}")
    condition = sql.SQL("id::text = ANY(%s) AND created_at >= %s AND created_at < %s")
    params: list[object] = [checker_missing, body["since"], body["until"]]
    if body["by_commit_timestamp"]:
        condition = sql.SQL("{} AND coalesce(pg_xact_commit_timestamp(xmin) <= %s, true)").format(condition)
        params.append(body["acknowledged"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id::text FROM {} WHERE {}").format(sql.Identifier(table), condition), params
        ).fetchall()
    text = (
        f"exit {done.returncode}, {body['missing']} missing in [{body['since']}, {body['until']}), "
        f"{sum(a['expected'] for a in body['aggregates'].values())} rows"
    )
    return AuditCheck(done.returncode, body["missing_ids"], [r[0] for r in rows], text)


def _cdc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _saved(conn: psycopg.Connection[Any], slot: str) -> tuple[datetime | None, datetime | None]:
    """The slot's saved acknowledged commit time and audited mark (cdc_checkpoint)."""
    row = conn.execute(
        "SELECT commit_time, audited_until FROM public.cdc_checkpoint WHERE slot = %s", (slot,)
    ).fetchone()
    return (None, None) if row is None else (row[0], row[1])


def _insert(conn: psycopg.Connection[Any], table: str, event_id: str) -> datetime:
    """A row of the run's kind; its created_at (its transaction's start)."""
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload) VALUES "
            "(%s, 'order', 'audit-open', %s, 1, jsonb_build_object('aggregate', 'audit-open', 'seq', 0, "
            "'txn', -2, 'pad', 'a')) RETURNING created_at"
        ).format(sql.Identifier(table)),
        (event_id, EVENT_TYPE),
    ).fetchone()
    assert row is not None
    created: datetime = row[0]
    return created


def _publish_until(env: dict[str, str], dsn: str, slot: str, created: datetime, log_path: Path) -> bool:
    """`cdc run` until its saved position is past a row created at ``created``; then SIGTERM."""
    proc = start_cdc_run(env, log_path)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                acknowledged = _saved(conn, slot)[0]
            if acknowledged is not None and acknowledged >= created:
                return True
            time.sleep(0.5)
        return False
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_across_audit(
    env: dict[str, str], dsn: str, table: str, slot: str, log_dir: Path
) -> tuple[bool, str]:
    """A transaction open across an audit (issue 42, item 2), after the run's own audit moved the mark: its
    row, committed later and lost (the slot advanced past it with no pipeline running), must be what the
    incremental audit from the new mark reports missing, and `cdc outbox prune --audited` must keep it."""
    margin = ("--margin", "10s")  # the scenario's records are its own, seconds old: read only those
    with psycopg.connect(dsn, autocommit=True) as conn:
        mark = _saved(conn, slot)[1]
        if mark is None:
            return False, "the run's audit noted no mark"
        lost, before = str(uuid.uuid4()), str(uuid.uuid4())
        with psycopg.connect(dsn) as long_conn:
            _insert(long_conn, table, lost)
            time.sleep(2.5)  # room for a prune cutoff between the long row and the next mark
            created = _insert(conn, table, before)
            if not _publish_until(env, dsn, slot, created, log_dir / "open-across-audit-1.log"):
                return False, "cdc run did not acknowledge the row committed beside the open transaction"
            first = _cdc(env, "audit", "--since", mark.isoformat(), "--json", *margin)
            if first.returncode != 0:
                return (
                    False,
                    f"the audit with a transaction open exited {first.returncode}: {first.stderr[-300:]}",
                )
            noted = datetime.fromisoformat(json.loads(first.stdout)["audited_until"])
            long_conn.commit()
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
        created = _insert(conn, table, str(uuid.uuid4()))
        if not _publish_until(env, dsn, slot, created, log_dir / "open-across-audit-2.log"):
            return False, "cdc run did not acknowledge the row committed after the lost one"
        second = _cdc(env, "audit", "--since", noted.isoformat(), "--json", *margin)
        found = json.loads(second.stdout)["missing_ids"] if second.stdout.strip() else None
        older = conn.execute("SELECT ceil(extract(epoch FROM now() - %s)) + 1", (noted,)).fetchone()[0]  # type: ignore[index]
        pruned = _cdc(env, "outbox", "prune", "--older-than", f"{int(older)}s", "--audited")
        kept = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE id = %s").format(sql.Identifier(table)), (lost,)
        ).fetchone()[0]  # type: ignore[index]
    ok = second.returncode == 1 and found == [lost] and pruned.returncode == 0 and kept == 1
    named = "[the lost row]" if found == [lost] else found
    return ok, (
        f"incremental audit exit {second.returncode}, missing {named}; "
        f"prune --audited exit {pruned.returncode}, the lost row {'kept' if kept else 'DELETED'}"
    )

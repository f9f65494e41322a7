"""`cdc audit` at the end of a fault run, against the suite's own checker (tests/faults/check.py).

The audit judges the rows of its window (by default up to the slot's last saved acknowledged position, which
`cdc run` writes every ``status_interval``: the last seconds of a run may fall after it). So the checker's
missing ids are narrowed to the same window, with the same conditions, before the two are compared: each
must name exactly the other's ids, and the audit must exit 1 when there are any, 0 when none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from tests.children import die_with_parent

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
        [sys.executable, "-m", "cdc", "audit", "--since", since.isoformat(), "--json"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=die_with_parent(),
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

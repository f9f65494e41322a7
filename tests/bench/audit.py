"""`make bench-audit`: what `cdc audit` costs, at each size, with the peak memory as the figure that must not
grow (issue 29: an audit of 10 000 000 events within the memory of one of 10 000; issue 42: a report of
10 000 000 missing events within the memory of one of none).

For each size, a database of its own gets the bench's outbox and generator (tests/bench/db.py), `cdc setup`,
then the rows in transactions of 10 000; `cdc run` publishes them all (the slot confirms past the last one,
and its saved position reaches it); then `cdc audit --since 1h --json` runs while its VmHWM is read from
/proc. One line per size:

    bench-audit: events=10000 peak_rss_mb=.. seconds=.. cpu_s=.. audited=10000 missing=0

``--missing N`` (repeatable) measures a loss instead: 10 000 events published, then N rows committed while
no pipeline runs and the slot advanced past them (lost), then 10 000 more published; the audit's JSON,
which lists every missing id, goes to a file, and must name all N:

    bench-audit: events=20000 lost=400000 peak_rss_mb=.. seconds=.. cpu_s=.. audited=420000 missing=400000
        ids=400000

``--audit-from DIR`` runs `cdc audit` from another checkout (the same interpreter and packages), to measure
the code of another commit on the same data, e.g. a `git worktree` of main.

    . .stack/env && python -m tests.bench.audit --events 10000 --events 10000000
    . .stack/env && python -m tests.bench.audit --missing 400000 --missing 4000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.bench.db import SlotWatch, connect, drop_database, dsn_for, generator_sql, recreate_database
from tests.bench.load import bulk_fill
from tests.bench.procs import vmhwm_mb
from tests.children import crash_dumps, dying_with_parent
from tests.kafka_admin import delete_topics_with_prefix

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_TXN = 10_000


def cdc(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        dying_with_parent([sys.executable, "-m", "cdc", *args]),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"cdc {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def publish_all(env: dict[str, str], dsn: str, slot: str, target_lsn: int, events: int) -> None:
    """`cdc run` until the slot confirmed ``target_lsn`` and saved a position at the last commit."""
    log = open(Path("/tmp") / f"bench-audit-{slot}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        dying_with_parent([sys.executable, "-m", "cdc", "run"]),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    watch = SlotWatch(dsn)
    try:
        watch.wait_confirmed(slot, target_lsn, timeout=120 + events / 20_000)
        with connect(dsn) as conn:
            last = conn.execute("SELECT max(created_at) FROM public.outbox").fetchone()[0]  # type: ignore[index]
            deadline = time.monotonic() + 60
            while True:
                row = conn.execute("SELECT commit_time FROM public.cdc_checkpoint WHERE slot = %s", (slot,))
                saved = row.fetchone()
                if saved is not None and saved[0] is not None and saved[0] >= last:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("cdc run saved no position past the last transaction")
                time.sleep(0.5)
    finally:
        watch.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        log.close()


def audit_peak(env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float, float, dict[str, Any], int]:
    """(peak RSS in MiB, seconds, its CPU seconds, the report without its ids, how many ids it lists) of one
    `cdc audit --since 1h --json`, its output in a file (a report of millions of ids is read line by line).
    The CPU time is the process's own (user + system), which a loaded machine stretches less than the wall
    time: the children reaped while it ran are only the audit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "cdc", "audit", "--since", "1h", "--json"]),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, vmhwm_mb(proc.pid) or 0.0)
            time.sleep(0.05)
        _, err = proc.communicate()
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"cdc audit exited {proc.returncode}: {err.strip()[-2000:]}")
        out.seek(0)
        report, ids = read_report(out)
    return peak, seconds, cpu, report, ids


def read_report(lines: Iterable[str]) -> tuple[dict[str, Any], int]:
    """The JSON report without its ``missing_ids`` (listed last, one per line, as `cdc audit --json` writes
    it), and how many ids it lists."""
    rest = iter(lines)
    head: list[str] = []
    ids = 0
    for line in rest:
        if line.strip().startswith('"missing_ids": ['):
            if not line.rstrip().endswith("[]"):
                ids = sum(1 for item in rest if item.startswith('    "'))
            break
        head.append(line)
    return json.loads("".join(head).rstrip().rstrip(",") + "\n}"), ids


def one_size(admin_dsn: str, bootstrap: str, events: int, lost: int = 0, audit_from: Path = ROOT) -> str:
    run = uuid.uuid4().hex[:8]
    database = f"bench_audit_{run}"
    slot = f"bench_audit_{run}"
    with connect(admin_dsn) as admin:
        recreate_database(admin, database)
    dsn = dsn_for(admin_dsn, database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k.startswith("CDC_KAFKA_")}
    env.update(
        CDC_DATABASE_URL=dsn,
        CDC_KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        CDC_SLOT=slot,
        CDC_PUBLICATION=slot,
        CDC_TABLE="public.outbox",
        CDC_TOPIC_TEMPLATE=f"bench.audit.{run}.{{aggregate_type}}",
        CDC_DLQ_TOPIC=f"bench.audit.{run}.dlq",
        CDC_SCHEMAS_DIR=str(ROOT / "schemas"),
        CDC_STATUS_INTERVAL="1",
        CDC_TOPIC_PARTITIONS="6",
    )
    try:
        with connect(dsn) as conn:
            conn.execute(generator_sql())
        cdc(env, "setup")
        fill = bulk_fill(dsn, events=events, rows_per_txn=min(ROWS_PER_TXN, events), aggregates=500)
        publish_all(env, dsn, slot, fill["target_lsn"], events)
        if lost:
            bulk_fill(dsn, events=lost, rows_per_txn=min(ROWS_PER_TXN, lost), aggregates=500, first=events)
            with connect(dsn) as conn:  # no pipeline runs: these rows' events are lost
                conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
            tail = bulk_fill(
                dsn,
                events=events,
                rows_per_txn=min(ROWS_PER_TXN, events),
                aggregates=500,
                first=events + lost,
            )
            publish_all(env, dsn, slot, tail["target_lsn"], events)
        peak, seconds, cpu, report, ids = audit_peak(env, audit_from)
        audited = sum(a["expected"] for a in report["aggregates"].values())
        line = f"bench-audit: events={events * (2 if lost else 1)}"
        line += f" lost={lost}" if lost else ""
        line += f" peak_rss_mb={peak:.1f} seconds={seconds:.1f} cpu_s={cpu:.1f} audited={audited}"
        line += f" missing={report['missing']}"
        if lost:
            line += f" ids={ids}"
            if report["missing"] != lost or ids != lost:
                line += " WRONG"
        return line
    finally:
        cdc(env, "teardown", "--yes")
        with connect(admin_dsn) as admin:
            drop_database(admin, database)
        delete_topics_with_prefix(AdminClient({"bootstrap.servers": bootstrap}), f"bench.audit.{run}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, action="append", help="repeatable (default 10000 and 1000000)")
    parser.add_argument(
        "--missing", type=int, action="append", default=[], help="repeatable: a run that loses this many"
    )
    parser.add_argument("--audit-from", type=Path, default=ROOT, help="run `cdc audit` from this checkout")
    args = parser.parse_args(argv)
    crash_dumps()
    admin_dsn, bootstrap = os.environ["CDC_DATABASE_URL"], os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    failed = False
    for events in args.events or ([] if args.missing else [10_000, 1_000_000]):
        print(one_size(admin_dsn, bootstrap, events, audit_from=args.audit_from), flush=True)
    for lost in args.missing:
        line = one_size(admin_dsn, bootstrap, ROWS_PER_TXN, lost, audit_from=args.audit_from)
        failed = failed or line.endswith("WRONG")
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

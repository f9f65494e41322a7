"""`make bench-audit`: what `cdc audit` costs, at each size, with the peak memory as the figure that must not
grow (issue 29: an audit of 10 000 000 events within the memory of one of 10 000).

For each size, a database of its own gets the bench's outbox and generator (tests/bench/db.py), `cdc setup`,
then the rows in transactions of 10 000; `cdc run` publishes them all (the slot confirms past the last one,
and its saved position reaches it); then `cdc audit --since 1h --json` runs while its VmHWM is read from
/proc. One line per size:

    bench-audit: events=10000 peak_rss_mb=.. seconds=.. audited=10000 missing=0

    . .stack/env && python -m tests.bench.audit --events 10000 --events 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.bench.db import SlotWatch, connect, drop_database, dsn_for, generator_sql, recreate_database
from tests.bench.load import bulk_fill
from tests.bench.procs import vmhwm_mb
from tests.children import crash_dumps, die_with_parent
from tests.kafka_admin import delete_topics_with_prefix

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_TXN = 10_000


def cdc(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cdc", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=die_with_parent(),
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"cdc {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def publish_all(env: dict[str, str], dsn: str, slot: str, target_lsn: int, events: int) -> None:
    """`cdc run` until the slot confirmed ``target_lsn`` and saved a position at the last commit."""
    log = open(Path("/tmp") / f"bench-audit-{slot}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc", "run"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        preexec_fn=die_with_parent(),
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


def audit_peak(env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """(peak RSS in MiB, seconds, the report) of one `cdc audit --since 1h --json`."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc", "audit", "--since", "1h", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent(),
    )
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, vmhwm_mb(proc.pid) or 0.0)
        time.sleep(0.05)
    out, err = proc.communicate()
    seconds = time.monotonic() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"cdc audit exited {proc.returncode}: {err.strip()[-2000:]}")
    return peak, seconds, json.loads(out)


def one_size(admin_dsn: str, bootstrap: str, events: int) -> str:
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
        peak, seconds, report = audit_peak(env)
        audited = sum(a["expected"] for a in report["aggregates"].values())
        return (
            f"bench-audit: events={events} peak_rss_mb={peak:.1f} seconds={seconds:.1f} "
            f"audited={audited} missing={report['missing']}"
        )
    finally:
        cdc(env, "teardown", "--yes")
        with connect(admin_dsn) as admin:
            drop_database(admin, database)
        delete_topics_with_prefix(AdminClient({"bootstrap.servers": bootstrap}), f"bench.audit.{run}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, action="append", help="repeatable (default 10000 and 1000000)")
    args = parser.parse_args(argv)
    crash_dumps()
    admin_dsn, bootstrap = os.environ["CDC_DATABASE_URL"], os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    for events in args.events or [10_000, 1_000_000]:
        print(one_size(admin_dsn, bootstrap, events), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make soak`: `cdc run` and an idempotent consumer under a steady offered load for a long time; does
anything grow, does the latency tail stay down, is anything missing at the end?

    . .stack/env && python -m tests.bench.soak --minutes 30 --rate 20000     # the defaults

Set-up, like `make bench-audit`: a database of its own (``soak_<run>``, dropped at the end) with the payload
table and the generator (below), `cdc setup` with a slot and publication of its own, its own topics
(``soak.<run>.order``, 6 partitions, kept for the run plus 10 minutes; deleted at the end). Then, all as
subprocesses: `cdc run`, and ``examples.invoice_service`` (an IdempotentConsumer writing one invoice per
OrderPlaced, its processed_events in the same database; its per-event INFO line turned off, which would write
gigabytes at this rate); a load generator (a process of its own, so that its clock shares no GIL with the
sampling) and a latency consumer (a thread here).

The load: ``--rate`` OrderPlaced events/s for ``--minutes``, offered on a monotonic schedule (open loop: a
late transaction goes at once; each is due when the events before it are; none starts after the end, and what
was due but not sent by then counts as not offered) over ``--loader-connections`` connections, in transactions
of mixed sizes (1, 10, 50, 200 and 1000 rows: 30, 30, 25, 12 and 3 % of the transactions, 70 rows on average,
so that 43 % of the events come in transactions of 1000 and 34 % in those of 200). Payloads (jsonb, built once
in SQL): 95 % small (~300 B, OrderPlaced v1, one in ten of them v2 with a short coupon), 5 % ~4 KB and 0.05 %
~100 KB (v2, the size in the coupon, the one free-form field of the schema; its text compresses about 4x, as
JSON does). The invoice service reads them as v1. Event ids are ``md5('soak-event-' || g)::uuid`` for a
sequence number g, so that the final check needs no outbox row: ``cdc outbox prune --older-than 2m`` runs
every minute, as in production, which keeps the table (and the disk) small and gives autovacuum its work.

Sampled every ``--sample-seconds`` (2): RSS, open file descriptors, threads and CPU of `cdc run` and of the
consumer (/proc); CPU of the walsender, of all PostgreSQL (the postmaster and its children, other databases'
too), of the broker, of the load generator and of this process, and of the machine: what limits the rate;
the slot's lag, ``pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)``; the topic's
end offsets and the consumer group's committed offsets (published, consumed, the consumer's lag); the
checkpointer's counters (pg_stat_bgwriter, pg_stat_checkpointer from PostgreSQL 17 on) and vacuums
(pg_stat_progress_vacuum, any database of the server; autovacuum_count + vacuum_count of the soak database's
tables); free disk space where PostgreSQL keeps its data.

Latency, commit-to-consume: a Kafka consumer in this process reads the event topic from its start; for each
record, the time poll() handed it over (the batch it came in: one time for all) minus the record's timestamp,
which `cdc run` sets to the transaction's commit time (ms, truncated). Both are this machine's wall clock
(time.time() here, the commit timestamp of PostgreSQL on the same machine). Counted per minute of receipt, in
1 ms buckets (the memory does not grow with the run), p50 and p99 per minute. It is an upper bound of
commit-to-ack: it also holds the fetch, and any wait of this process.

A checkpoint "ran in" a minute when one started in it (the counter of timed + requested checkpoints moved)
or completed in it (its write + sync time was added); a vacuum when one was seen running at a sample of the
minute, or one of the soak database's tables counted a vacuum that ended in it. Note: at high rates WAL fills
max_wal_size and checkpoints follow each other, so that nearly every minute has one.

At the end: the load stops, a last one-row transaction is committed; the slot must confirm it, then the
consumer group's committed offsets reach the topic's end offsets (each wait gives up after 60 s without
progress, or ``--drain-timeout``); then every generated id must be in processed_events, and the invoices
count must equal the events (one effect each).

It FAILS (exit 1) on:

- growth beyond noise: the median over the first 5 minutes against the last 5 (the first and last third of a
  run shorter than 10 minutes) of each process's RSS (more than max(10 MB, 10 %)), fds and threads (more
  than 2);
- a minute whose commit-to-consume p99 is over 100 ms with neither a checkpoint nor a vacuum in it, or in
  which no record arrived;
- not keeping up: the load generator more than 5 s of load behind its schedule at any time (the rate was not
  offered), or `cdc run` (events committed but not in the topic) or the consumer (in the topic, not committed)
  more than 5 s of load behind when the load ends, or not drained in time;
- any event missing at the end, or a second invoice for one, a dead letter, or a process that exited; the
  load stopped early because PostgreSQL's disk had less than 10 GB free.

Output: one line per minute, then ``soak: result=PASS|FAIL ...`` and a line per failure; JSON of every sample
and a plot (RSS and p99 over time) in ``bench-results/soak-<date>.{json,png}``, the processes' logs beside
them. ``--inject missing`` (deletes 5 processed_events rows before the check) and ``--inject growth`` (adds
50 MB to `cdc run`'s RSS samples of the last window) show that the judgement catches what it should.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue as queue_module
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.bench.db import connect, drop_database, dsn_for, recreate_database
from tests.bench.measure import Watermarks
from tests.bench.procs import MachineCpu, cpu_seconds, open_fds, rss_mb, threads, tree_cpu_seconds
from tests.bench.run import _pipeline_ack_latency, kafka_pid, machine_info

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 6
PAYLOADS = 10_000
AGGREGATES = 1_000
WARM_UP_ROWS = 100
# Rows per transaction and the share of transactions of that size (%): 70 rows on average.
TXN_SIZES = (1, 10, 50, 200, 1000)
TXN_WEIGHTS = (30, 30, 25, 12, 3)

# Judgement.
P99_LIMIT_MS = 100.0
RSS_NOISE_MB, RSS_NOISE_SHARE = 10.0, 0.10
COUNT_NOISE = 2  # fds, threads
BEHIND_LIMIT_S = 5.0  # of offered load
STALL_S = 60.0  # a wait at the end gives up after this long without progress
LOW_DISK_BYTES = 10 * 2**30  # the load stops when PostgreSQL's disk has less free (a shared machine)

# The payload table and the generator, made before `cdc setup` so that no slot decodes the payload table.
GENERATOR_SQL = f"""
CREATE TABLE soak_payloads (n int PRIMARY KEY, version int NOT NULL, payload jsonb NOT NULL);
INSERT INTO soak_payloads (n, version, payload)
SELECT n, CASE WHEN pad > 0 OR n % 10 = 5 THEN 2 ELSE 1 END,
       jsonb_build_object(
           'order_id', 'ord-' || lpad(n::text, 12, '0'),
           'customer_id', 'cust-' || lpad(((n * 7) % 100000)::text, 8, '0'),
           'amount_cents', 500 + (n * 7919) % 250000,
           'currency', (ARRAY['EUR', 'USD', 'GBP', 'CHF'])[1 + n % 4],
           'items', (SELECT jsonb_agg(jsonb_build_object(
                         'sku', 'SKU-' || lpad(((n * 31 + k * 977) % 1000000)::text, 7, '0'),
                         'quantity', 1 + (n + k) % 5))
                     FROM generate_series(1, 4 + n % 3) AS k))
       || CASE WHEN pad > 0 THEN jsonb_build_object('coupon',
                   (SELECT left(string_agg(repeat(md5(n || '-' || i), 4), ''), pad)
                    FROM generate_series(1, pad / 128 + 1) AS i))
               WHEN n % 10 = 5 THEN jsonb_build_object('coupon', 'SPRING-' || n)
               ELSE '{{}}'::jsonb END
FROM (SELECT n, CASE WHEN n % 2000 = 1999 THEN 100000 WHEN n % 20 = 3 THEN 3800 ELSE 0 END AS pad
      FROM generate_series(0, {PAYLOADS} - 1) AS n) AS s;
ANALYZE soak_payloads;

SET check_function_bodies = off;  -- public.outbox is created later, by cdc setup
CREATE FUNCTION soak_insert(p_first bigint, p_rows int) RETURNS void LANGUAGE sql AS $fn$
INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, schema_version, payload)
SELECT md5('soak-event-' || g)::uuid, 'order', 'order-' || ((g * 7919) % {AGGREGATES}), 'OrderPlaced',
       p.version, p.payload
FROM generate_series(p_first, p_first + p_rows - 1) AS g
JOIN soak_payloads p ON p.n = (g % {PAYLOADS})::int
$fn$;
RESET check_function_bodies;
"""

# The consumer: examples.invoice_service as it is, with its one INFO line per invoice turned off.
CONSUMER_MAIN = (
    "import logging, sys\n"
    "from examples.invoice_service import main\n"
    "logging.getLogger('invoice_service').setLevel(logging.WARNING)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class SoakError(Exception):
    pass


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the load ------------------------------------------------------------------------------------------


def offer_load(
    dsn: str,
    rate: float,
    seconds: float,
    first: int,
    connections: int,
    seed: int,
    out: Any,
    stop: Any,
) -> None:
    """In a process of its own: commit transactions of mixed sizes (TXN_SIZES) of ``soak_insert`` so that
    ``rate`` events/s are offered for ``seconds`` s, each transaction due when the events scheduled before it
    are (open loop: a late one goes at once). Generator numbers are handed out in order, so the committed
    events are exactly ``[first, next_first)``. Puts a progress dict on ``out`` every second and a final one
    with ``done``; stops early when ``stop`` is set."""
    try:
        rng = random.Random(seed)
        lock = threading.Lock()
        state: dict[str, Any] = {
            "next_first": first,
            "scheduled": 0,
            "committed": 0,
            "txns": 0,
            "max_behind": 0,
        }
        window: dict[str, Any] = {"max_late": 0.0, "commit_ms": []}
        errors: list[str] = []
        clock: dict[str, float] = {}

        def start_clock() -> None:
            clock["start"] = time.monotonic() + 0.05
            clock["end"] = clock["start"] + seconds

        ready = threading.Barrier(connections + 1, action=start_clock)

        def take() -> tuple[int, int, float] | None:
            with lock:
                if stop.is_set() or errors:
                    return None
                due = clock["start"] + state["scheduled"] / rate
                if due >= clock["end"] or time.monotonic() >= clock["end"]:
                    return None  # the end: what was due and not sent by now is counted as not offered
                rows = rng.choices(TXN_SIZES, TXN_WEIGHTS)[0]
                g = state["next_first"]
                state["next_first"] += rows
                state["scheduled"] += rows
                return g, rows, due

        def worker() -> None:
            try:
                with connect(dsn) as conn:
                    cur = conn.cursor()
                    cur.execute("SELECT soak_insert(%s, %s)", (first, 0), prepare=True)  # planned before
                    ready.wait(30)
                    while (job := take()) is not None:
                        g, rows, due = job
                        now = time.monotonic()
                        if now < due:
                            time.sleep(due - now)
                            now = time.monotonic()
                        cur.execute("SELECT soak_insert(%s, %s)", (g, rows), prepare=True)
                        done = time.monotonic()
                        with lock:
                            state["committed"] += rows
                            state["txns"] += 1
                            window["max_late"] = max(window["max_late"], now - due)
                            window["commit_ms"].append((done - now) * 1000)
            except BaseException as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                ready.abort()

        workers = [threading.Thread(target=worker, name=f"loader-{n}") for n in range(connections)]
        for thread in workers:
            thread.start()
        ready.wait(60)

        def report(**extra: Any) -> None:
            with lock:
                commit_ms = sorted(window["commit_ms"])
                elapsed = time.monotonic() - clock["start"]
                behind = max(0, round(min(elapsed, seconds) * rate) - state["committed"])
                state["max_behind"] = max(state["max_behind"], behind)
                out.put(
                    {
                        "t": time.time(),
                        "elapsed_s": round(elapsed, 3),
                        "committed": state["committed"],
                        "txns": state["txns"],
                        "next_first": state["next_first"],
                        # Of the events due by now (the schedule), how many are not committed yet.
                        "behind": behind,
                        "max_behind": state["max_behind"],
                        "max_late_ms": round(window["max_late"] * 1000, 1),
                        "commit_ms_p99": _pct(commit_ms, 0.99),
                        "commit_ms_max": round(commit_ms[-1], 1) if commit_ms else None,
                        **extra,
                    }
                )
                window["max_late"], window["commit_ms"] = 0.0, []

        while any(thread.is_alive() for thread in workers):
            time.sleep(1.0)
            report()
        for thread in workers:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        report(done=True, loader_cpu_s=round(time.process_time(), 2))
    except BaseException as exc:  # report, never leave the soak waiting
        out.put({"error": f"{type(exc).__name__}: {exc}", "done": True})
        raise


def stack_kafka_pid() -> int | None:
    """The broker's pid from the pid file of the stack that .stack/env describes (a worktree has none)."""
    socket_dir = os.environ.get("CDC_STACK_PG_SOCKET_DIR")
    if not socket_dir:
        return None
    try:
        return int((Path(socket_dir).parent / "kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def _pct(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 1)


# -- latency ---------------------------------------------------------------------------------------------


class LatencyHistograms(threading.Thread):
    """Reads ``topic`` from its start; for each record, receive time minus record timestamp (commit time), in
    1 ms buckets per minute of receipt since ``origin`` (wall clock; minute -1 before it is set)."""

    def __init__(self, bootstrap: str, topic: str, group_id: str) -> None:
        super().__init__(name="latency-consumer", daemon=True)
        self.topic = topic
        self.config = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "enable.partition.eof": False,
        }
        self.origin: float | None = None
        self.minutes: dict[int, dict[int, int]] = {}
        self.count = 0
        self.errors: list[str] = []
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self._stop_event = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.config)
        try:
            metadata = consumer.list_topics(self.topic, timeout=10)
            partitions = sorted(metadata.topics[self.topic].partitions)
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            self.ready.set()
            while not self._stop_event.is_set():
                first = consumer.poll(0.1)
                if first is None:
                    continue
                now = time.time()
                now_ms = now * 1000
                batch = [first, *consumer.consume(num_messages=1000, timeout=0)]
                minute = -1 if self.origin is None else int((now - self.origin) // 60)
                with self.lock:
                    buckets = self.minutes.setdefault(minute, {})
                    for message in batch:
                        if message.error() is not None:
                            if len(self.errors) < 100:
                                self.errors.append(message.error().str())
                            continue
                        latency = int(now_ms - message.timestamp()[1])
                        buckets[latency] = buckets.get(latency, 0) + 1
                        self.count += 1
        except KafkaException as exc:
            self.errors.append(str(exc))
        finally:
            self.ready.set()
            consumer.close()

    def minute(self, index: int) -> dict[str, Any]:
        with self.lock:
            buckets = dict(self.minutes.get(index, {}))
        return histogram_figures(buckets)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(15)


def histogram_figures(buckets: dict[int, int]) -> dict[str, Any]:
    """count, p50, p99 and max (ms) of a {latency ms: count} histogram."""
    total = sum(buckets.values())
    if not total:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    keys = sorted(buckets)
    wanted = {"p50_ms": 0.50, "p99_ms": 0.99}
    out: dict[str, Any] = {"count": total, "max_ms": keys[-1]}
    seen = 0
    for key in keys:
        seen += buckets[key]
        for name, p in list(wanted.items()):
            if seen > total * p or seen == total:
                out[name] = key
                del wanted[name]
        if not wanted:
            break
    return out


# -- processes -------------------------------------------------------------------------------------------


class Child:
    """A subprocess whose stdout and stderr go to ``log_path``; SIGTERM to stop, SIGKILL after a bound."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.stopped: dict[str, Any] | None = None

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60) -> dict[str, Any]:
        if self.stopped is not None:
            return self.stopped
        started, killed = time.monotonic(), False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                killed = True
        self._log.close()
        self.stopped = {
            "exit_code": self.proc.returncode,
            "killed": killed,
            "stop_seconds": round(time.monotonic() - started, 2),
        }
        return self.stopped


# -- the server's side -----------------------------------------------------------------------------------


class ServerStats:
    """The slot's lag, checkpoints, vacuums and free disk, over one connection to the soak database."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.conn = connect(dsn)
        self.slot = slot
        self.version = self.conn.info.server_version
        (self.database,) = self.conn.execute("SELECT current_database()").fetchone()  # type: ignore[misc]
        (data_directory,) = self.conn.execute("SHOW data_directory").fetchone()  # type: ignore[misc]
        self.data_directory = data_directory if os.path.isdir(data_directory) else "/"
        try:  # the postmaster: all PostgreSQL spends is its and its children's
            self.postmaster: int | None = int(Path(data_directory, "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            self.postmaster = None

    def checkpoints(self) -> tuple[int, float]:
        """(checkpoints started: timed + requested, ms spent writing + syncing by the completed ones)."""
        if self.version >= 170000:
            query = "SELECT num_timed + num_requested, write_time + sync_time FROM pg_stat_checkpointer"
        else:
            query = (
                "SELECT checkpoints_timed + checkpoints_req, checkpoint_write_time + checkpoint_sync_time "
                "FROM pg_stat_bgwriter"
            )
        row = self.conn.execute(query).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])

    def sample(self) -> dict[str, Any]:
        slot = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active_pid "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        started, ckpt_ms = self.checkpoints()
        running = self.conn.execute(
            "SELECT pid, datname, relid::regclass::text, phase FROM pg_stat_progress_vacuum"
        ).fetchall()
        counts = self.conn.execute(
            "SELECT relid::regclass::text, autovacuum_count + vacuum_count FROM pg_stat_user_tables"
        ).fetchall()
        disk = os.statvfs(self.data_directory)
        return {
            "slot_lag_bytes": int(slot[0]) if slot and slot[0] is not None else None,
            "walsender_pid": slot[1] if slot else None,
            "checkpoints_started": started,
            "checkpoint_write_sync_ms": ckpt_ms,
            "vacuums_running": [
                {"pid": pid, "database": db, "table": table, "phase": phase}
                for pid, db, table, phase in running
            ],
            "vacuum_counts": {table: int(n) for table, n in counts},
            "disk_free_bytes": disk.f_bavail * disk.f_frsize,
        }

    def close(self) -> None:
        self.conn.close()


# -- the soak --------------------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        admin_dsn = os.environ.get("CDC_DATABASE_URL")
        bootstrap = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
        if not admin_dsn or not bootstrap:
            raise SoakError("CDC_DATABASE_URL and CDC_KAFKA_BOOTSTRAP_SERVERS must be set (. .stack/env)")
        self.admin_dsn, self.bootstrap = admin_dsn, bootstrap
        self.run_id = time.strftime("%H%M%S") + secrets.token_hex(2)
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out_dir: Path = args.output_dir
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.base = self.out_dir / f"soak-{self.stamp}"
        self.database = f"soak_{self.run_id}"
        self.slot = f"soak_{self.run_id}"
        self.topic_prefix = f"soak.{self.run_id}"
        self.topic = f"{self.topic_prefix}.order"  # every row has aggregate_type 'order'
        self.dlq_topic = f"{self.topic_prefix}.dlq"
        self.consumer_name = f"soak_{self.run_id}_invoices"
        self.consumer_dlq = f"{self.topic_prefix}.invoices.dlq"
        self.dsn = dsn_for(admin_dsn, self.database)
        self.load_seconds = args.minutes * 60
        self.kafka_admin = AdminClient({"bootstrap.servers": bootstrap})
        self.children: list[Child] = []
        self.latency: LatencyHistograms | None = None
        self.loader: Any = None
        self.loader_stop: Any = None
        self.server: ServerStats | None = None
        self.created_database = False
        self.samples: list[dict[str, Any]] = []
        self.minutes: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.result: dict[str, Any] = {
            "run_id": self.run_id,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": {
                "minutes": args.minutes,
                "rate": args.rate,
                "loader_connections": args.loader_connections,
                "txn_sizes": dict(zip(TXN_SIZES, TXN_WEIGHTS, strict=True)),
                "payloads": "95 % ~300 B (v1, a tenth v2), 5 % ~4 KB, 0.05 % ~100 KB (v2, coupon)",
                "database": self.database,
                "topic": self.topic,
                "prune_older_than": args.prune_older_than,
                "inject": args.inject,
            },
            "judgement": {
                "windows": "first and last 5 minutes (a third each below 10 minutes), medians",
                "rss_growth_mb_max": f"max({RSS_NOISE_MB:g}, {RSS_NOISE_SHARE:.0%} of the first)",
                "fds_threads_growth_max": COUNT_NOISE,
                "p99_ms_max": P99_LIMIT_MS,
                "behind_s_max": BEHIND_LIMIT_S,
            },
        }

    # -- set-up ------------------------------------------------------------------------------------------

    def pipeline_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k.startswith("CDC_KAFKA_")}
        env.update(
            CDC_DATABASE_URL=self.dsn,
            CDC_KAFKA_BOOTSTRAP_SERVERS=self.bootstrap,
            CDC_SLOT=self.slot,
            CDC_PUBLICATION=self.slot,
            CDC_TABLE="public.outbox",
            CDC_TOPIC_TEMPLATE=f"{self.topic_prefix}.{{aggregate_type}}",
            CDC_DLQ_TOPIC=self.dlq_topic,
            CDC_SCHEMAS_DIR=str(ROOT / "schemas"),
            CDC_TOPIC_PARTITIONS=str(PARTITIONS),
            CDC_LOG_LEVEL="INFO",
        )
        return env

    def cdc(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdc", *args],
            cwd=ROOT,
            env=self.pipeline_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def set_up(self) -> None:
        progress(f"set-up: database {self.database}, slot {self.slot}, topics {self.topic_prefix}.*")
        with connect(self.admin_dsn) as admin:
            self.result["machine"] = machine_info(admin)
            recreate_database(admin, self.database)
            self.created_database = True
        with connect(self.dsn) as conn:
            conn.execute(GENERATOR_SQL)
            row = conn.execute(
                "SELECT avg(octet_length(payload::text)), max(octet_length(payload::text)) FROM soak_payloads"
            ).fetchone()
            assert row is not None
            self.result["config"]["payload_bytes_avg"] = round(float(row[0]))
            self.result["config"]["payload_bytes_max"] = int(row[1])
        done = self.cdc("setup")
        if done.returncode != 0:
            raise SoakError(f"cdc setup exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        # Kept for the run and 10 minutes more: a consumer further behind than that loses records (missing).
        retention = {"retention.ms": str(int((self.load_seconds + 600) * 1000)), "segment.bytes": str(2**27)}
        topics = [
            NewTopic(self.topic, num_partitions=PARTITIONS, replication_factor=1, config=retention),
            NewTopic(self.dlq_topic, num_partitions=1, replication_factor=1),
            NewTopic(self.consumer_dlq, num_partitions=1, replication_factor=1),
        ]
        for future in self.kafka_admin.create_topics(topics, operation_timeout=30).values():
            future.result(timeout=60)

    def start(self) -> None:
        a = self.args
        self.server = ServerStats(self.dsn, self.slot)
        run = Child(
            "run",
            [sys.executable, "-m", "cdc", "run"],
            self.pipeline_env(),
            self.base.with_name(self.base.name + "-run.log"),
        )
        self.children.append(run)
        self.wait(
            "cdc run streaming",
            lambda: (self.server.sample()["walsender_pid"] is not None, 0),
            total=60,
        )
        self.latency = LatencyHistograms(self.bootstrap, self.topic, f"soak-{self.run_id}-latency")
        self.latency.start()
        if not self.latency.ready.wait(30) or self.latency.errors:
            raise SoakError(f"the latency consumer did not start: {self.latency.errors}")
        consumer_env = {
            k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k.startswith("CDC_KAFKA")
        }
        consumer_env.update(INVOICE_DATABASE_URL=self.dsn, CDC_KAFKA_BOOTSTRAP_SERVERS=self.bootstrap)
        consumer = Child(
            "consumer",
            [sys.executable, "-c", CONSUMER_MAIN, "--topic", self.topic, "--name", self.consumer_name]
            + ["--dlq-topic", self.consumer_dlq, "--invoices-table", "invoices"]
            + ["--processed-table", "public.processed_events", *a.consumer_arg],
            consumer_env,
            self.base.with_name(self.base.name + "-consumer.log"),
        )
        self.children.append(consumer)
        # Warm-up: a first transaction through the whole way proves both processes live.
        with connect(self.dsn) as conn:
            conn.execute("SELECT soak_insert(0, %s)", (WARM_UP_ROWS,))
        self.offsets = Watermarks(self.kafka_admin, self.topic, PARTITIONS)
        self.wait(
            "the warm-up consumed", lambda: (self.consumed() >= WARM_UP_ROWS, self.consumed()), total=120
        )
        progress(f"cdc run (pid {run.pid}) and the consumer (pid {consumer.pid}) are up")

    # -- Kafka offsets -----------------------------------------------------------------------------------

    def published(self) -> int:
        return sum(max(0, v) for v in self.offsets.read().values())

    def consumed(self) -> int:
        request = ConsumerGroupTopicPartitions(
            self.consumer_name, [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        )
        future = self.kafka_admin.list_consumer_group_offsets([request], request_timeout=10)[
            self.consumer_name
        ]
        answer = future.result(timeout=15)
        return sum(max(0, tp.offset) for tp in answer.topic_partitions)

    # -- waiting -----------------------------------------------------------------------------------------

    def alive(self) -> None:
        for child in self.children:
            code = child.exited()
            if code is not None:
                raise SoakError(f"{child.name} exited with code {code}:\n{child.log_tail()}")

    def wait(self, what: str, check: Any, total: float, stall: float = STALL_S) -> float:
        """Until ``check()`` gives (True, _); its second value is a progress figure: the wait gives up when
        it has not moved for ``stall`` s, or after ``total`` s. Returns the seconds waited."""
        started = time.monotonic()
        last_value, last_move = None, started
        while True:
            self.alive()
            ok, value = check()
            now = time.monotonic()
            if ok:
                return now - started
            if value != last_value:
                last_value, last_move = value, now
            if now - last_move > stall:
                raise SoakError(f"{what}: no progress for {stall:g} s (at {value})")
            if now - started > total:
                raise SoakError(f"{what}: not done within {total:g} s (at {value})")
            time.sleep(0.5)

    # -- the run -----------------------------------------------------------------------------------------

    def run(self) -> None:
        a = self.args
        self.set_up()
        self.start()
        assert self.latency is not None and self.server is not None
        ctx = multiprocessing.get_context("spawn")
        loader_out = ctx.Queue()
        self.loader_stop = ctx.Event()
        self.loader = ctx.Process(
            target=offer_load,
            args=(
                self.dsn,
                a.rate,
                self.load_seconds,
                WARM_UP_ROWS,
                a.loader_connections,
                a.seed,
                loader_out,
                self.loader_stop,
            ),
            name="soak-loader",
        )
        progress(f"offering {a.rate:,.0f} events/s for {a.minutes:g} min")
        self.loader.start()
        t0 = time.monotonic()
        self.latency.origin = time.time()
        machine = MachineCpu()
        kafka = kafka_pid() or stack_kafka_pid()
        loaded: dict[str, Any] = {"committed": 0, "behind": 0}
        minute_start = self.snapshot(t0, loaded, kafka)
        minute_index, total_minutes = 0, math.ceil(a.minutes - 1e-9)
        next_prune = t0 + 60 if a.prune_older_than != "0" else math.inf
        pruner: subprocess.Popen[str] | None = None
        self.result["prunes"] = []
        while True:
            time.sleep(a.sample_seconds)
            while True:
                try:
                    report = loader_out.get_nowait()
                except queue_module.Empty:
                    break
                if "error" in report:
                    raise SoakError(f"the load generator failed: {report['error']}")
                loaded = report
            self.alive()
            if not loaded.get("done") and not self.loader.is_alive() and loader_out.empty():
                raise SoakError(f"the load generator exited with code {self.loader.exitcode} and no result")
            if not loaded.get("done") and time.monotonic() - t0 > self.load_seconds + 120:
                raise SoakError("the load generator did not finish within 120 s of the end of the load")
            sample = self.snapshot(t0, loaded, kafka)
            self.samples.append(sample)
            if sample["disk_free_bytes"] < LOW_DISK_BYTES and not self.loader_stop.is_set():
                self.failures.append(
                    f"disk: {sample['disk_free_bytes'] / 2**30:.1f} GB free where PostgreSQL keeps its data; "
                    "the load was stopped early"
                )
                self.loader_stop.set()
            now = time.monotonic()
            if pruner is not None and pruner.poll() is not None:
                out, err = pruner.communicate()
                self.result["prunes"].append(
                    {"t": round(now - t0, 1), "exit": pruner.returncode, "out": out.strip()}
                )
                if pruner.returncode != 0:
                    self.failures.append(f"cdc outbox prune exited {pruner.returncode}: {err.strip()[-500:]}")
                pruner = None
            if now >= next_prune and pruner is None and not loaded.get("done"):
                pruner = subprocess.Popen(
                    [sys.executable, "-m", "cdc", "outbox", "prune", "--older-than", a.prune_older_than],
                    cwd=ROOT,
                    env=self.pipeline_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                next_prune = now + 60
            # A minute closes at its end; the last one (maybe shorter) when the load is over, unless it is
            # closed already: what arrives after that counts as the drain's (latency_after_load).
            minute_over = sample["t"] >= (minute_index + 1) * 60 and minute_index < total_minutes
            if minute_over or (loaded.get("done") and minute_index < total_minutes):
                figures = self.close_minute(minute_index, minute_start, sample, machine)
                self.minutes.append(figures)
                print(self.minute_line(figures), flush=True)
                minute_start, machine = sample, MachineCpu()
                minute_index += 1
            if loaded.get("done"):
                break
        if pruner is not None:
            try:
                pruner.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pruner.kill()
                pruner.communicate()
        self.result["load"] = loaded
        if loaded.get("error"):
            raise SoakError(f"the load generator failed: {loaded['error']}")
        self.loader.join(30)
        self.finish(loaded, t0)

    def snapshot(self, t0: float, loaded: dict[str, Any], kafka: int | None) -> dict[str, Any]:
        assert self.server is not None and self.latency is not None
        server = self.server.sample()
        sample: dict[str, Any] = {"t": round(time.monotonic() - t0, 2)}
        for child in self.children:
            sample[f"rss_{child.name}_mb"] = rss_mb(child.pid)
            sample[f"fds_{child.name}"] = open_fds(child.pid)
            sample[f"threads_{child.name}"] = threads(child.pid)
            sample[f"cpu_{child.name}_s"] = cpu_seconds(child.pid)
        sample["cpu_walsender_s"] = cpu_seconds(server["walsender_pid"])
        sample["cpu_kafka_s"] = cpu_seconds(kafka)
        sample["cpu_postgres_s"] = tree_cpu_seconds(self.server.postmaster)
        sample["cpu_loader_s"] = cpu_seconds(self.loader.pid if self.loader is not None else None)
        sample["cpu_soak_s"] = cpu_seconds(os.getpid())
        sample["loadavg_1m"] = os.getloadavg()[0]
        sample["committed"] = loaded.get("committed", 0)
        sample["loader_behind"] = loaded.get("behind", 0)
        sample["loader_commit_ms_max"] = loaded.get("commit_ms_max")
        sample["published"] = self.published() - WARM_UP_ROWS
        sample["consumed"] = self.consumed() - WARM_UP_ROWS
        sample["received"] = self.latency.count - WARM_UP_ROWS
        sample.update(server)
        return sample

    def close_minute(
        self, index: int, start: dict[str, Any], end: dict[str, Any], machine: MachineCpu
    ) -> dict[str, Any]:
        assert self.latency is not None
        seconds = max(1e-3, end["t"] - start["t"])
        inside = [s for s in self.samples if start["t"] < s["t"] <= end["t"]]

        def rate(key: str) -> int:
            return round((end[key] - start[key]) / seconds)

        def median(key: str) -> float | None:
            values = [s[key] for s in inside if s.get(key) is not None]
            return round(statistics.median(values), 1) if values else None

        def cores(key: str) -> float | None:
            if start.get(key) is None or end.get(key) is None:
                return None
            return round((end[key] - start[key]) / seconds, 2)

        running = {(v["pid"], v["database"], v["table"]) for s in inside for v in s["vacuums_running"]}
        ended = {
            table
            for table, n in end["vacuum_counts"].items()
            if n > start["vacuum_counts"].get(table, 0)
            and not any(db == self.database and t == table for _, db, t in running)
        }
        latency = self.latency.minute(index)
        figures = {
            "minute": index + 1,
            "seconds": round(seconds, 1),
            "offered_per_s": rate("committed"),
            "published_per_s": rate("published"),
            "consumed_per_s": rate("consumed"),
            "received": latency["count"],
            "p50_ms": latency["p50_ms"],
            "p99_ms": latency["p99_ms"],
            "max_ms": latency["max_ms"],
            "rss_run_mb": median("rss_run_mb"),
            "rss_consumer_mb": median("rss_consumer_mb"),
            "fds_run": median("fds_run"),
            "fds_consumer": median("fds_consumer"),
            "threads_run": median("threads_run"),
            "threads_consumer": median("threads_consumer"),
            "cores_run": cores("cpu_run_s"),
            "cores_consumer": cores("cpu_consumer_s"),
            "cores_walsender": cores("cpu_walsender_s"),
            "cores_kafka": cores("cpu_kafka_s"),
            "cores_postgres": cores("cpu_postgres_s"),  # every PostgreSQL process: the walsender too
            "cores_loader": cores("cpu_loader_s"),
            "cores_soak": cores("cpu_soak_s"),
            **{f"machine_{k}": v for k, v in machine.read().items()},
            "slot_lag_mb": max((s["slot_lag_bytes"] or 0 for s in inside), default=0) / 2**20,
            "pipeline_lag": end["committed"] - end["published"],
            "consumer_lag": end["published"] - end["consumed"],
            "loader_behind": end["loader_behind"],
            "loader_commit_ms_max": max((s["loader_commit_ms_max"] or 0 for s in inside), default=None),
            "checkpoints_started": end["checkpoints_started"] - start["checkpoints_started"],
            "checkpoints_completed": sum(
                1
                for a, b in zip([start, *inside], inside, strict=False)
                if b["checkpoint_write_sync_ms"] > a["checkpoint_write_sync_ms"]
            ),
            "vacuums": sorted(f"{db}:{table}" for _, db, table in running)
            + sorted(f"{self.database}:{t} (ended)" for t in ended),
            "disk_free_gb": round(end["disk_free_bytes"] / 2**30, 1),
        }
        figures["checkpoint"] = figures["checkpoints_started"] + figures["checkpoints_completed"]
        figures["vacuum"] = len(figures["vacuums"])
        figures["slot_lag_mb"] = round(figures["slot_lag_mb"], 1)
        return figures

    @staticmethod
    def minute_line(m: dict[str, Any]) -> str:
        return (
            f"soak: minute={m['minute']} offered={m['offered_per_s']}/s published={m['published_per_s']}/s "
            f"consumed={m['consumed_per_s']}/s p50_ms={m['p50_ms']} p99_ms={m['p99_ms']} "
            f"rss_run_mb={m['rss_run_mb']} rss_consumer_mb={m['rss_consumer_mb']} fds_run={_g(m['fds_run'])} "
            f"fds_consumer={_g(m['fds_consumer'])} threads_run={_g(m['threads_run'])} "
            f"threads_consumer={_g(m['threads_consumer'])} slot_lag_mb={m['slot_lag_mb']} "
            f"consumer_lag={m['consumer_lag']} cores_run={m['cores_run']} "
            f"cores_consumer={m['cores_consumer']} cores_postgres={m['cores_postgres']} "
            f"cores_kafka={m['cores_kafka']} "
            f"machine_cores={m.get('machine_busy_cores')} checkpoint={m['checkpoint']} vacuum={m['vacuum']}"
        )

    # -- the end -----------------------------------------------------------------------------------------

    def finish(self, loaded: dict[str, Any], t0: float) -> None:
        a = self.args
        assert self.server is not None
        end_of_load = self.samples[-1] if self.samples else {}
        rate = a.rate
        # The loader: the most it was behind its schedule at any time; the others: when the load ended.
        behind = {
            "loader": loaded.get("max_behind", 0) / rate,
            "pipeline": (end_of_load.get("committed", 0) - end_of_load.get("published", 0)) / rate,
            "consumer": (end_of_load.get("published", 0) - end_of_load.get("consumed", 0)) / rate,
        }
        self.result["behind_s"] = {k: round(v, 1) for k, v in behind.items()}
        achieved = loaded.get("committed", 0) / self.load_seconds
        self.result["offered_per_s"] = round(achieved)
        what = {
            "loader": f"the load generator could not offer {rate:,.0f} events/s (it committed "
            f"{achieved:,.0f}/s: PostgreSQL's commits too slow, or the machine too busy), behind its "
            "schedule by up to",
            "pipeline": "cdc run did not keep up: committed events not in the topic when the load ended,",
            "consumer": "the consumer did not keep up: events in the topic it had not committed when the "
            "load ended,",
        }
        for who, seconds in behind.items():
            if seconds > BEHIND_LIMIT_S:
                self.failures.append(f"behind: {what[who]} {seconds:.1f} s of load")

        # A last transaction, committed after everything: the slot confirms it only after all before it.
        events = loaded["next_first"] + 1  # the warm-up, the load and this one
        with connect(self.dsn) as conn, conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            conn.execute("SELECT soak_insert(%s, 1)", (loaded["next_first"],))
            (target,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()  # type: ignore[misc]
        progress(f"load over: {events:,} events; draining")
        drained: dict[str, float | None] = {"slot": None, "consumer": None}
        started = time.monotonic()
        try:
            with connect(self.dsn) as conn:

                def confirmed() -> tuple[bool, Any]:
                    row = conn.execute(
                        "SELECT confirmed_flush_lsn >= %s::pg_lsn, confirmed_flush_lsn::text "
                        "FROM pg_replication_slots WHERE slot_name = %s",
                        (target, self.slot),
                    ).fetchone()
                    assert row is not None
                    return bool(row[0]), row[1]

                drained["slot"] = round(
                    self.wait("the slot confirming the last transaction", confirmed, a.drain_timeout), 1
                )
            topic_end = self.published()
            if topic_end < events:
                self.failures.append(f"missing in the topic: {events - topic_end} of {events} events")
            remaining = a.drain_timeout - (time.monotonic() - started)
            drained["consumer"] = round(
                self.wait(
                    "the consumer committing the whole topic",
                    lambda: (self.consumed() >= topic_end, self.consumed()),
                    max(remaining, 30),
                ),
                1,
            )
        except SoakError as exc:
            self.failures.append(f"not drained: {exc}")
        self.result["drain_s"] = drained
        self.result["load_and_drain_s"] = round(time.monotonic() - t0, 1)
        assert self.latency is not None
        drain_latency = {}
        for index in sorted(self.latency.minutes):
            if index >= len(self.minutes):
                drain_latency[index + 1] = self.latency.minute(index)
        self.result["latency_after_load"] = drain_latency
        self.result["latency_consumer_errors"] = self.latency.errors[:10]
        self.latency.stop()

        for child in list(self.children):
            child.stop()
        run = self.children[0]
        self.result["processes"] = {
            c.name: {**(c.stopped or {}), "log": str(c.log_path), "pid": c.pid} for c in self.children
        }
        self.result["commit_to_ack"] = _pipeline_ack_latency(run.log_path)
        self.check_events(events, bool(drained["consumer"] is not None))

    def check_events(self, events: int, drained: bool) -> None:
        with connect(self.dsn) as conn:
            conn.execute("SET statement_timeout = '15min'")
            if "missing" in self.args.inject:
                conn.execute(
                    "DELETE FROM public.processed_events WHERE ctid IN "
                    "(SELECT ctid FROM public.processed_events WHERE consumer = %s LIMIT 5)",
                    (self.consumer_name,),
                )
                progress("inject: deleted 5 rows of processed_events")
            absent = conn.execute(
                "SELECT md5('soak-event-' || g)::uuid::text FROM generate_series(0, %s - 1) AS g "
                "WHERE NOT EXISTS (SELECT 1 FROM public.processed_events p "
                "WHERE p.consumer = %s AND p.event_id = md5('soak-event-' || g)::uuid::text)",
                (events, self.consumer_name),
            ).fetchall()
            (processed,) = conn.execute(  # type: ignore[misc]
                "SELECT count(*) FROM public.processed_events WHERE consumer = %s", (self.consumer_name,)
            ).fetchone()
            (invoices,) = conn.execute("SELECT count(*) FROM invoices").fetchone()  # type: ignore[misc]
        dlq = {}
        for topic in (self.dlq_topic, self.consumer_dlq):
            dlq[topic] = sum(max(0, v) for v in Watermarks(self.kafka_admin, topic, 1).read().values())
        check = {
            "events": events,
            "missing": len(absent),
            "missing_ids": [row[0] for row in absent[:20]],
            "processed_rows": int(processed),
            "invoices": int(invoices),
            "dead_letters": dlq,
        }
        self.result["check"] = check
        if absent:
            if drained:
                self.failures.append(f"missing: {len(absent)} of {events} events not in processed_events")
            else:
                self.failures.append(f"not consumed by the end: {len(absent)} of {events} events")
        if invoices != events - len(absent):
            self.failures.append(f"invoices: {invoices} for {events - len(absent)} processed events")
        if any(dlq.values()):
            self.failures.append(f"dead letters: {dlq}")

    # -- judgement ---------------------------------------------------------------------------------------

    def judge(self) -> dict[str, Any]:
        samples = [s for s in self.samples if s["t"] <= self.load_seconds + 2 * self.args.sample_seconds]
        if not samples:
            return {}
        span = samples[-1]["t"]
        window = 300.0 if self.args.minutes >= 10 else span / 3
        first = [s for s in samples if s["t"] <= window]
        last = [s for s in samples if s["t"] >= span - window]
        if "growth" in self.args.inject:
            last = [{**s, "rss_run_mb": (s["rss_run_mb"] or 0) + 50} for s in last]
            progress("inject: 50 MB added to cdc run's RSS samples of the last window")
        growth: dict[str, Any] = {"window_s": round(window, 1)}
        for key in (
            "rss_run_mb",
            "rss_consumer_mb",
            "fds_run",
            "fds_consumer",
            "threads_run",
            "threads_consumer",
        ):
            a = [s[key] for s in first if s.get(key) is not None]
            b = [s[key] for s in last if s.get(key) is not None]
            if not a or not b:
                continue
            before, after = statistics.median(a), statistics.median(b)
            limit = max(RSS_NOISE_MB, RSS_NOISE_SHARE * before) if key.startswith("rss") else COUNT_NOISE
            grew = after - before > limit
            growth[key] = {
                "first": round(before, 1),
                "last": round(after, 1),
                "limit": round(limit, 1),
                "grew": grew,
            }
            if grew:
                self.failures.append(
                    f"growth: {key} {before:.1f} -> {after:.1f} (median of the first {window:.0f} s against "
                    f"the last), more than {limit:.1f}"
                )
        over, unexplained = [], []
        for m in self.minutes:
            if m["p99_ms"] is None:
                if m["offered_per_s"] > 0:
                    unexplained.append(m["minute"])
                    self.failures.append(f"latency: no record arrived in minute {m['minute']}")
                continue
            if m["p99_ms"] > P99_LIMIT_MS:
                over.append(m["minute"])
                if not m["checkpoint"] and not m["vacuum"]:
                    unexplained.append(m["minute"])
                    self.failures.append(
                        f"latency: p99 {m['p99_ms']} ms in minute {m['minute']}, "
                        "no checkpoint or vacuum in it"
                    )
        return {"growth": growth, "p99_over_minutes": over, "unexplained_p99_minutes": unexplained}

    def final_line(self, verdict: dict[str, Any]) -> str:
        check = self.result.get("check", {})
        growth = verdict.get("growth", {})

        def pair(key: str) -> str:
            g = growth.get(key)
            return f"{g['first']:g}/{g['last']:g}" if g else "n/a"

        p99s = [m["p99_ms"] for m in self.minutes if m["p99_ms"] is not None]
        lags = [m["slot_lag_mb"] for m in self.minutes]
        ack = self.result.get("commit_to_ack") or {}

        def pairs(values: dict[str, Any] | None) -> str:
            return ",".join(f"{k}:{v}" for k, v in (values or {}).items()) or "n/a"

        return (
            f"soak: result={self.result['result']} minutes={self.args.minutes:g} rate={self.args.rate:g}/s "
            f"offered={self.result.get('offered_per_s', 'n/a')}/s events={check.get('events', 'n/a')} "
            f"missing={check.get('missing', 'n/a')} invoices={check.get('invoices', 'n/a')} "
            f"rss_run_mb={pair('rss_run_mb')} rss_consumer_mb={pair('rss_consumer_mb')} "
            f"fds_run={pair('fds_run')} fds_consumer={pair('fds_consumer')} "
            f"threads_run={pair('threads_run')} "
            f"threads_consumer={pair('threads_consumer')} p99_max_ms={max(p99s, default='n/a')} "
            f"p99_over_100_minutes={len(verdict.get('p99_over_minutes', []))} "
            f"unexplained_p99_minutes={len(verdict.get('unexplained_p99_minutes', []))} "
            f"slot_lag_max_mb={max(lags, default='n/a')} "
            f"behind_s={pairs(self.result.get('behind_s'))} "
            f"drain_s={pairs(self.result.get('drain_s'))} commit_to_ack_p99_ms={ack.get('p99_ms', 'n/a')}"
        )

    # -- output and clean-up -----------------------------------------------------------------------------

    def write(self) -> tuple[Path, Path | None]:
        self.result["minutes"] = self.minutes
        self.result["samples"] = self.samples
        self.result["failures"] = self.failures
        json_path = self.base.with_suffix(".json")
        json_path.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        png_path: Path | None = self.base.with_suffix(".png")
        try:
            plot(self.result, png_path)  # type: ignore[arg-type]
        except Exception as exc:  # the figures stand without the picture
            progress(f"no plot: {type(exc).__name__}: {exc}")
            png_path = None
        return json_path, png_path

    def cleanup(self) -> list[str]:
        problems: list[str] = []

        def attempt(what: str, action: Any) -> None:
            try:
                action()
            except Exception as exc:
                problems.append(f"{what}: {type(exc).__name__}: {exc}")

        if self.loader is not None and self.loader.is_alive():
            self.loader_stop.set()
            attempt("stop the loader", lambda: self.loader.join(30))
            if self.loader.is_alive():
                attempt("terminate the loader", lambda: (self.loader.terminate(), self.loader.join(10)))
        if self.latency is not None and self.latency.is_alive():
            attempt("stop the latency consumer", self.latency.stop)
        for child in self.children:
            attempt(f"stop {child.name}", child.stop)
        if self.server is not None:
            attempt("close the stats connection", self.server.close)
        if self.created_database:
            attempt("cdc teardown", lambda: self.cdc("teardown", "--yes", timeout=120))

            def drop() -> None:
                with connect(self.admin_dsn) as admin:
                    drop_database(admin, self.database)

            attempt("drop the database", drop)

        def delete_topics() -> None:
            names = [
                t
                for t in self.kafka_admin.list_topics(timeout=10).topics
                if t.startswith(self.topic_prefix + ".")
            ]
            if names:
                for future in self.kafka_admin.delete_topics(names, operation_timeout=30).values():
                    future.result(timeout=60)

        attempt("delete the topics", delete_topics)

        def delete_group() -> None:
            groups = self.kafka_admin.list_consumer_groups(request_timeout=10).result(timeout=15)
            if any(g.group_id == self.consumer_name for g in groups.valid):
                for future in self.kafka_admin.delete_consumer_groups([self.consumer_name]).values():
                    future.result(timeout=30)

        attempt("delete the consumer group", delete_group)
        return problems


def plot(result: dict[str, Any], path: Path) -> None:
    """Two panels over the minutes of the run: RSS of both processes, commit-to-consume p50/p99 per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, minutes = result["samples"], result["minutes"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    t = [s["t"] / 60 for s in samples]
    for key, label in (("rss_run_mb", "cdc run"), ("rss_consumer_mb", "invoice consumer")):
        top.plot(t, [s[key] for s in samples], label=label)
    top.set_ylabel("RSS (MB)")
    top.set_ylim(bottom=0)
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    edges = [0.0]
    for m in minutes:
        edges.append(edges[-1] + m["seconds"] / 60)

    def values(key: str) -> list[float]:
        return [math.nan if m[key] is None else m[key] for m in minutes]

    if minutes:
        bottom.stairs(
            values("p99_ms"), edges, label="p99 per minute", color="tab:red", linewidth=2, baseline=None
        )
        bottom.stairs(
            values("p50_ms"), edges, label="p50 per minute", color="tab:blue", linewidth=2, baseline=None
        )
    middles = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
    explained = [(x, m) for x, m in zip(middles, minutes, strict=True) if m["checkpoint"] or m["vacuum"]]
    bottom.scatter(
        [x for x, _ in explained],
        [m["p99_ms"] or 0 for _, m in explained],
        marker="x",
        color="black",
        label="checkpoint or vacuum in the minute",
        zorder=3,
    )
    bottom.axhline(P99_LIMIT_MS, color="grey", linestyle="--", label=f"{P99_LIMIT_MS:g} ms")
    bottom.set_ylabel("commit-to-consume (ms)")
    bottom.set_xlabel("minutes since the load started")
    highest = max((m["p99_ms"] for m in minutes if m["p99_ms"] is not None), default=0)
    bottom.set_ylim(0, max(highest, P99_LIMIT_MS) * 1.35)  # room for the legend above the lines
    bottom.legend(loc="upper left", fontsize="small", ncol=4)
    bottom.grid(alpha=0.3)
    config = result["config"]
    fig.suptitle(
        f"make soak {result['started_at']}: {config['rate']:,.0f} events/s offered for "
        f"{config['minutes']:g} min, {result.get('result')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the load (default 30)")
    p.add_argument("--rate", type=float, default=20_000.0, help="offered events/s (default 20 000)")
    p.add_argument("--loader-connections", type=int, default=4, help="connections of the load (default 4)")
    p.add_argument("--sample-seconds", type=float, default=2.0, help="between two samples (default 2)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=300.0,
        help="the most the end waits for the backlog (default 300)",
    )
    p.add_argument(
        "--prune-older-than",
        default="2m",
        help="cdc outbox prune --older-than, every minute of the load (default 2m; 0: no pruning)",
    )
    p.add_argument("--seed", type=int, default=1, help="of the transaction sizes (default 1)")
    p.add_argument(
        "--consumer-arg", action="append", default=[], help="one more argument of examples.invoice_service"
    )
    p.add_argument("--output-dir", type=Path, default=ROOT / "bench-results", help="default bench-results/")
    p.add_argument(
        "--inject",
        choices=("missing", "growth"),
        action="append",
        default=[],
        help="to check the soak itself (repeatable): delete 5 processed_events rows before the check "
        "(missing), add 50 MB to cdc run's RSS samples of the last window (growth)",
    )
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0:
        p.error("--minutes and --rate must be positive")
    return args


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    soak = Soak(args)
    error = None
    try:
        soak.run()
    except (Exception, KeyboardInterrupt) as exc:
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        soak.failures.append(f"error: {error}")
    finally:
        problems = soak.cleanup()
    if problems:
        soak.result["cleanup_problems"] = problems
        soak.failures.extend(f"clean-up: {p}" for p in problems)
    verdict = soak.judge()
    soak.result["verdict"] = verdict
    soak.result["result"] = "FAIL" if soak.failures else "PASS"
    json_path, png_path = soak.write()
    print(soak.final_line(verdict), flush=True)
    for failure in soak.failures:
        print(f"soak: failed: {failure}", flush=True)
    print(f"soak: results {json_path}" + (f", {png_path}" if png_path else ""), flush=True)
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())

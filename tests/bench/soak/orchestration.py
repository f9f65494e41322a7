"""The soak from set-up to drain: the run's names and result, the load generator started and followed,
a sample every ``--sample-seconds``, a prune every minute, a line per minute, then the last transaction and
the drain. The soak itself is described in the package's docstring (tests/bench/soak/__init__.py)."""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import queue as queue_module
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from tests.bench.db import connect, dsn_for
from tests.bench.procs import MachineCpu
from tests.bench.run import _pipeline_ack_latency, kafka_pid
from tests.bench.soak import LOW_DISK_BYTES, ROOT, WARM_UP_ROWS, SoakError, progress
from tests.bench.soak.judgement import (
    BEHIND_LIMIT_S,
    COUNT_NOISE,
    P99_LIMIT_MS,
    RSS_NOISE_MB,
    RSS_NOISE_SHARE,
    Judgement,
)
from tests.bench.soak.load import TXN_SIZES, TXN_WEIGHTS, offer_load
from tests.bench.soak.output import Output
from tests.bench.soak.pipeline import Child, Pipeline
from tests.bench.soak.sampling import LatencyHistograms, Sampling, ServerStats, stack_kafka_pid
from tests.children import dying_with_parent


class Soak(Pipeline, Sampling, Judgement, Output):
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
        self.group_reader: Consumer | None = None  # reads the consumer group's committed offsets
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
                os.getpid(),
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
                    dying_with_parent(
                        [sys.executable, "-m", "cdc", "outbox", "prune", "--older-than", a.prune_older_than]
                    ),
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

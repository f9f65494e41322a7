"""`make faults`: the pipeline under a seeded schedule of faults, then a count of what Kafka holds.

    python -m tests.faults [--seed N] [--duration 200] [--runs 1] [--big-rows 1000000] [--sabotage]
                           [--delivery exactly-once] [--brokers 3]

One run: a fresh broker on the fault stack (`tests/faults/stack.py`), a private outbox (table, publication,
slot, topics), `cdc run` under a supervisor that restarts it whenever it exits, the load of
`tests/faults/load.py`, and the faults of `tests/faults/schedule.py` at their times. After ``duration``: the
faults stop, the load stops, the pipeline must catch up (the slot confirmed past the last commit), SIGTERM
must end it with exit 0, every topic is read back and decoded, and a second `cdc run` must publish nothing.
Then one figure line; the last line printed is the figure line of the run (or of all runs). Exit 1 on any
violation, 2 when the harness itself could not run.

``--delivery exactly-once`` runs `cdc run` with Kafka transactions: then a read_committed reader must see
no duplicate either (``no_duplicates_for_read_committed``).

``--brokers 3`` runs on a three-broker cluster (`stack/cluster.sh`, replication factor 3,
min.insync.replicas = 2) with the cluster's faults instead of the single broker's (`tests/faults/schedule.py`,
``make_cluster_schedule``): kill -9 of a partition leader, a controlled shutdown, a rolling restart, and two
brokers down so that the in-sync replicas fall below the minimum, all under load and pipeline kills. The
figure line then says ``brokers=3`` and what each cluster fault did.

``--sabotage`` advances the slot behind the pipeline's back in the middle of the run: the suite must then
report missing events and exit 1 (the proof that it can fail).

A passing run's directory under ``faults-results/`` is removed unless ``--keep``; a failing one is kept: the
schedule, what each fault did, and every pipeline start's log (at DEBUG, one line per acknowledged delivery
with event id, topic, partition and offset: grep an event id to see where it went).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.config_loader import load_settings
from cdc.consumer import EventDeserializer
from cdc.errors import format_lsn, parse_lsn
from cdc.ops import setup as cdc_setup
from tests.children import crash_dumps, watchdog
from tests.faults.audit import open_across_audit, run_audit
from tests.faults.check import Verdict, analyze
from tests.faults.cluster import ClusterView
from tests.faults.load import AGGREGATE_TYPES, Load
from tests.faults.readback import read_dead_letters, read_events, watermarks
from tests.faults.schedule import (
    CLUSTER_OUTAGES,
    MIN_PIPELINE_KILLS,
    Fault,
    counts,
    make_cluster_schedule,
    make_schedule,
)
from tests.faults.stack import BROKER_NODES, ROOT, STACK_SCRIPT, FaultStack
from tests.faults.supervisor import Supervisor, start_cdc_run
from tests.plugins.proxy import TcpProxy

log = logging.getLogger("faults")

SCHEMAS = ROOT / "tests" / "faults" / "schemas"
# The pipeline's silence bounds in a fault run (the defaults are 30 s), and what a freeze may cost: the time
# from the freeze (or the thaw) to the slot confirming what was committed before it.
SILENCE = 10
QUERY_TIMEOUT = 5
FREEZE_BOUND = SILENCE + 25.0
# A broker's frozen connection ends when librdkafka's request on it times out (socket.timeout.ms, 60 s by
# default); at least once, cdc run then exits 1 and the supervisor starts it again.
BROKER_FREEZE_BOUND = 60 + 25.0
# A pipeline killed while it resumes starts over: the supervisor's delay, then a start (connections, exactly
# once the checkpoint read and init_transactions: 2-3 s here, more under load) and the work of the Kafka
# transaction the kill aborted. Each kill in a silence's window adds its delay and this to the bound.
KILL_ALLOWANCE = 10.0
RESULTS = ROOT / "faults-results"


@dataclass
class Run:
    seed: int
    tag: str
    dir: Path
    dsn: str
    bootstrap: str
    registry_url: str
    table: str
    slot: str
    topics: list[str]
    dlq: str
    env: dict[str, str]
    done: list[str] = field(default_factory=list)  # what each fault did, with its time

    def note(self, t0: float, text: str) -> None:
        line = f"t+{time.monotonic() - t0:6.1f} s {text}"
        self.done.append(line)
        log.info("%s", line)


# -- setting up a run ---------------------------------------------------------------------------------------


def prepare(stack: FaultStack, seed: int, args: argparse.Namespace) -> Run:
    if broker_mode(seed, args) == "fresh":
        stack.fresh_kafka()
    else:
        stack.restart_kafka()
    senv = stack.env()
    tag = f"faults_{seed}_{int(time.time()) % 100_000_000}"
    run_dir = RESULTS / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    dsn = senv["CDC_DATABASE_URL"]
    replication = senv.get("CDC_TOPIC_REPLICATION_FACTOR", "1")
    _drop_leftovers(dsn)
    template = tag + ".{aggregate_type}"
    overrides = {
        "database_url": dsn,
        "kafka.bootstrap_servers": senv["CDC_KAFKA_BOOTSTRAP_SERVERS"],
        "slot": tag,
        "publication": tag,
        "table": f"public.{tag}",
        "topic_template": template,
        "dlq_topic": f"{tag}.dlq",
        "schemas_dir": str(SCHEMAS),
        "topic_replication_factor": int(replication),
    }
    settings = load_settings(config_file=None, environ={}, overrides=overrides)
    cdc_setup.apply(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "CDC_DATABASE_URL": dsn,
            "CDC_KAFKA_BOOTSTRAP_SERVERS": senv["CDC_KAFKA_BOOTSTRAP_SERVERS"],
            "CDC_SLOT": tag,
            "CDC_PUBLICATION": tag,
            "CDC_TABLE": f"public.{tag}",
            "CDC_TOPIC_TEMPLATE": template,
            "CDC_DLQ_TOPIC": f"{tag}.dlq",
            "CDC_SCHEMAS_DIR": str(SCHEMAS),
            "CDC_TOPIC_REPLICATION_FACTOR": replication,
            "CDC_VALUE_FORMAT": value_format(seed, args),
            "CDC_STATUS_INTERVAL": "1",
            "CDC_BACKOFF_MAX": "2",
            "CDC_SOURCE_SILENCE_TIMEOUT": str(SILENCE),
            "CDC_QUERY_TIMEOUT": str(QUERY_TIMEOUT),
            "CDC_LOG_LEVEL": args.log_level,
        }
    )
    if args.delivery == "exactly-once":
        env.update(CDC_DELIVERY="exactly-once", CDC_CHECKPOINT_TOPIC=f"{tag}.checkpoints")
    return Run(
        seed=seed,
        tag=tag,
        dir=run_dir,
        dsn=dsn,
        bootstrap=senv["CDC_KAFKA_BOOTSTRAP_SERVERS"],
        registry_url=senv["CDC_SCHEMA_REGISTRY_URL"],
        table=tag,
        slot=tag,
        topics=[template.format(aggregate_type=t) for t in AGGREGATE_TYPES],
        dlq=f"{tag}.dlq",
        env=env,
    )


def broker_mode(seed: int, args: argparse.Namespace) -> str:
    """How the run's broker starts: on wiped storage (``fresh``) or on the storage of the runs before it,
    kill -9s included (``restart``); ``auto`` takes turns every two seeds. Either way it has just started, as
    after a `make stack-up`, and is loading its coordinators when the pipeline's producer first asks."""
    if args.broker != "auto":
        return str(args.broker)
    return "fresh" if seed // 2 % 2 == 0 else "restart"


def value_format(seed: int, args: argparse.Namespace) -> str:
    """``auto``: odd seeds single-object (no registry on the path), even ones confluent (registry outages)."""
    if args.value_format != "auto":
        return str(args.value_format)
    return "confluent" if seed % 2 == 0 else "single-object"


def _drop_leftovers(dsn: str) -> None:
    """Slots, publications and tables of earlier runs (kept when they failed) would pin WAL for ever."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'faults\\_%' AND NOT active"
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            _forget_position(conn, slot)
            conn.execute(
                psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(psycopg.sql.Identifier(slot))
            )
            conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(psycopg.sql.Identifier(slot)))


# -- the faults ---------------------------------------------------------------------------------------------


SLOW_FAULTS = ("kill_broker", "registry_down", "freeze_registry", "restart_postgres", "big_transaction")
# each in a thread of its own: pipeline kills keep their times
SLOW_FAULTS += ("freeze_pg", "freeze_pg_all", "freeze_broker", "freeze_broker_all", *CLUSTER_OUTAGES)
# Calm between two cluster faults, as between the single broker's outages.
CLUSTER_CALM = 6.0


class Faults:
    """Carries out the schedule: each fault at its time; outages in threads of their own, so that the
    pipeline kills keep their times during an outage."""

    def __init__(
        self,
        run: Run,
        schedule: list[Fault],
        stack: FaultStack,
        supervisor: Supervisor,
        proxy: TcpProxy,
        load: Load,
        big_rows: int,
        pg_proxy: TcpProxy,
        broker_proxy: TcpProxy | None,
    ) -> None:
        self.run, self.schedule, self.stack = run, schedule, stack
        self.supervisor, self.proxy, self.load, self.big_rows = supervisor, proxy, load, big_rows
        self.pg_proxy, self.broker_proxy = pg_proxy, broker_proxy
        # per silence fault: (seconds until the slot confirmed past it, its bound)
        self.resumed: list[tuple[float, float]] = []
        # When each outage held the stack (monotonic start, end; None while it lasts): the time another
        # outage holds it does not count against a silence's resumption.
        self._outages: list[list[float | None]] = []
        self._kills: list[tuple[float, float]] = []  # (monotonic time of a kill -9 of cdc run, restart delay)
        self.done: dict[str, int] = {}
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.t0 = 0.0
        # The cluster's faults, one at a time (each waits for the replicas of the one before it).
        self._cluster_lock = threading.Lock()
        self._cluster_calm_until = 0.0
        self.in_sync_max = 0.0  # the longest wait for every replica to be in sync again
        self.isr_low = 0.0  # seconds every partition of the run's topics spent below min.insync.replicas
        self.isr_low_committed = 0  # events committed meanwhile (they must wait, then all arrive)
        self.isr_low_refusals = 0  # NOT_ENOUGH_REPLICAS answers the broker left logged meanwhile

    def start(self, t0: float) -> None:
        self.t0 = t0
        thread = threading.Thread(target=self._run, name="faults", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(timeout=600)

    def _run(self) -> None:
        for fault in self.schedule:
            if self._stop.wait(max(0.0, self.t0 + fault.at - time.monotonic())):
                return
            if fault.kind in SLOW_FAULTS:
                thread = threading.Thread(target=self._do, args=(fault,), name=fault.kind, daemon=True)
                thread.start()
                self._threads.append(thread)
            else:
                self._do(fault)

    def _do(self, fault: Fault) -> None:
        try:
            getattr(self, fault.kind)(fault)
            self.done[fault.kind] = self.done.get(fault.kind, 0) + 1
        except Exception as exc:  # a fault that could not be done is a harness error, reported at the end
            self.errors.append(f"{fault.describe()}: {type(exc).__name__}: {exc}")
            self.run.note(self.t0, f"{fault.kind} FAILED: {exc}")

    def kill_pipeline(self, fault: Fault) -> None:
        deadline = time.monotonic() + 10
        while not self.supervisor.kill(fault.hold):  # between two starts: wait for the next one
            if time.monotonic() > deadline or self._stop.is_set():
                raise RuntimeError("no pipeline to kill for 10 s")
            time.sleep(0.2)
        self._kills.append((time.monotonic(), fault.hold))
        self.run.note(self.t0, f"kill -9 cdc run (restart in {fault.hold:.1f} s)")

    @contextmanager
    def _outage(self) -> Iterator[list[float | None]]:
        window: list[float | None] = [time.monotonic(), None]
        self._outages.append(window)
        try:
            yield window
        finally:
            window[1] = time.monotonic()

    def _blocked(self, since: float, now: float, own: list[float | None] | None) -> float:
        """Seconds of [since, now] during which another outage than ``own`` held the stack."""
        spans = sorted(
            (max(start or since, since), min(end or now, now))
            for start, end in [w for w in self._outages if w is not own]
        )
        total, reach = 0.0, since
        for start, end in spans:
            start = max(start, reach)
            if end > start:
                total += end - start
                reach = end
        return total

    def kill_broker(self, fault: Fault) -> None:
        with self._outage():
            self.stack.kill_broker()
            self.run.note(self.t0, f"kill -9 kafka (down {fault.hold:.1f} s)")
            time.sleep(fault.hold)
            self.stack.up()
        self.run.note(self.t0, "kafka restarted by stack.sh up")

    def restart_postgres(self, fault: Fault) -> None:
        with self._outage():
            self.run.note(self.t0, "pg_ctl restart -m immediate")
            self.stack.restart_postgres()
        self.run.note(self.t0, "postgres is back")

    def kill_walsender(self, fault: Fault) -> None:
        with psycopg.connect(self.run.dsn, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE slot_name = %s AND active_pid IS NOT NULL",
                (self.run.slot,),
            ).fetchall()
        self.run.note(self.t0, f"pg_terminate_backend of the walsender ({'done' if rows else 'none active'})")

    def registry_down(self, fault: Fault) -> None:
        with self._outage():
            self.proxy.stop()
            self.run.note(self.t0, f"schema registry unreachable for {fault.hold:.1f} s")
            time.sleep(fault.hold)
            self.proxy.start()
        self.run.note(self.t0, "schema registry reachable again")

    def freeze_registry(self, fault: Fault) -> None:
        with self._outage():
            self.proxy.freeze(new_too=True)
            self.run.note(
                self.t0, f"schema registry silent (connections open, nothing passes) for {fault.hold:.1f} s"
            )
            time.sleep(fault.hold)
            self.proxy.thaw()
        self.run.note(self.t0, "schema registry answers again")

    def freeze_pg(self, fault: Fault) -> None:
        """Every connection open from `cdc run` to PostgreSQL goes silent for good; new ones pass."""
        self._freeze_for_good(self.pg_proxy, "PostgreSQL connections of cdc run", FREEZE_BOUND)

    def freeze_pg_all(self, fault: Fault) -> None:
        """Every connection to PostgreSQL, new ones too, silent for ``hold``, then thawed."""
        self._freeze_then_thaw(self.pg_proxy, "PostgreSQL", fault)

    # -- the three-broker cluster's faults (--brokers 3) -------------------------------------------------

    @contextmanager
    def _cluster_fault(self) -> Iterator[ClusterView]:
        """One cluster fault at a time; whatever it left down comes back, even when it failed, so that the
        next one meets the whole cluster in sync."""
        with self._cluster_lock, self._outage():
            time.sleep(max(0.0, self._cluster_calm_until - time.monotonic()))
            view = ClusterView(self.run.bootstrap)
            try:
                yield view
            finally:
                if any(self.stack.node_pid(node) is None for node in BROKER_NODES):
                    self._cluster_back(view, "after a failed fault")
                self._cluster_calm_until = time.monotonic() + CLUSTER_CALM

    def _cluster_back(self, view: ClusterView, what: str) -> None:
        """`stack.sh up` starts whatever broker is down; then every replica must be in sync again."""
        self.stack.up()
        took = view.wait_in_sync()
        self.in_sync_max = max(self.in_sync_max, took)
        self.run.note(self.t0, f"{what}: every replica in sync {took:.1f} s after the restart")

    def kill_leader(self, fault: Fault) -> None:
        with self._cluster_fault() as view:
            topic = self.run.topics[0]
            node, partition = view.busiest_leader(topic)
            self.stack.kill_node(node)
            self.run.note(
                self.t0, f"kill -9 kafka {node}, leader of {topic}[{partition}] (down {fault.hold:.1f} s)"
            )
            time.sleep(fault.hold)
            self._cluster_back(view, f"kafka {node} restarted")

    def stop_broker(self, fault: Fault) -> None:
        with self._cluster_fault() as view:
            topic = self.run.topics[1]
            node, partition = view.busiest_leader(topic)
            took = self.stack.stop_node(node)
            self.run.note(
                self.t0,
                f"controlled shutdown of kafka {node}, leader of {topic}[{partition}], took {took:.1f} s "
                f"(down {fault.hold:.1f} s)",
            )
            time.sleep(fault.hold)
            self._cluster_back(view, f"kafka {node} restarted")

    def rolling_restart(self, fault: Fault) -> None:
        with self._cluster_fault() as view:
            for node in BROKER_NODES:
                took = self.stack.stop_node(node)
                self.run.note(
                    self.t0, f"rolling restart: controlled shutdown of kafka {node} took {took:.1f} s"
                )
                self._cluster_back(view, f"rolling restart: kafka {node} back")

    def isr_below_min(self, fault: Fault) -> None:
        """Two brokers down: the leader of the busiest partition by kill -9, another by SIGTERM. Every
        partition is left with one in-sync replica, below min.insync.replicas: no acks=all write may be
        appended, the producer waits (NOT_ENOUGH_REPLICAS is retriable), and nothing may be lost or
        dead-lettered. Held for ``hold`` seconds once every partition of the run's topics is below it."""
        with self._cluster_fault() as view:
            topics = [*self.run.topics, self.run.dlq]
            killed, _ = view.busiest_leader(self.run.topics[0])
            stopped = random.Random(self.run.seed).choice([n for n in BROKER_NODES if n != killed])
            survivor = next(n for n in BROKER_NODES if n not in (killed, stopped))
            survivor_log = self.stack.node_log(survivor)
            log_start = survivor_log.stat().st_size
            self.stack.kill_node(killed)
            self.stack.stop_node(stopped)
            self.run.note(
                self.t0, f"two brokers down: kill -9 kafka {killed}, controlled shutdown of {stopped}"
            )
            took = view.wait_isr_below_min(topics)
            low_since = time.monotonic()
            committed = len(self.load.ledger.committed)
            self.run.note(self.t0, f"every partition below min.insync.replicas {took:.1f} s later")
            while time.monotonic() - low_since < fault.hold:
                time.sleep(1.0)
                if not view.isr_below_min(topics):
                    raise RuntimeError("a partition of the run's topics got back to 2 in-sync replicas")
            self.isr_low = time.monotonic() - low_since
            self.isr_low_committed = len(self.load.ledger.committed) - committed
            # The broker logs each append it refuses for want of in-sync replicas: the producer was told
            # NOT_ENOUGH_REPLICAS (retriable), not something that would dead-letter an event.
            with survivor_log.open("rb") as f:
                f.seek(log_start)
                self.isr_low_refusals = f.read().count(b"NotEnoughReplicasException")
            self.run.note(
                self.t0,
                f"ISR < 2 for {self.isr_low:.1f} s: {self.isr_low_committed} events committed meanwhile, "
                f"{self.isr_low_refusals} appends refused with NOT_ENOUGH_REPLICAS (log of {survivor})",
            )
            self._cluster_back(view, f"kafka {killed} and {stopped} restarted")

    def freeze_broker(self, fault: Fault) -> None:
        """Every client connection open to the broker goes silent for good; new ones pass."""
        assert self.broker_proxy is not None, "no broker proxy on the cluster"
        # Exactly once, the failed transaction's abort may wait one more request timeout on the frozen
        # coordinator connection before a new producer takes over.
        extra = 60 if self.run.env.get("CDC_DELIVERY") == "exactly-once" else 0
        self._freeze_for_good(self.broker_proxy, "Kafka client connections", BROKER_FREEZE_BOUND + extra)

    def freeze_broker_all(self, fault: Fault) -> None:
        """Every client connection to the broker, new ones too, silent for ``hold``, then thawed."""
        assert self.broker_proxy is not None, "no broker proxy on the cluster"
        self._freeze_then_thaw(self.broker_proxy, "Kafka", fault)

    def _freeze_for_good(self, proxy: TcpProxy, what: str, bound: float) -> None:
        target = _current_lsn(self.run.dsn)
        proxy.freeze()
        frozen = time.monotonic()
        self.run.note(self.t0, f"{what} frozen for good (new ones pass)")
        self._resumed(frozen, target, bound, None)

    def _freeze_then_thaw(self, proxy: TcpProxy, what: str, fault: Fault) -> None:
        with self._outage() as own:
            proxy.freeze(new_too=True)
            self.run.note(self.t0, f"{what} silent for cdc run (every connection) for {fault.hold:.1f} s")
            time.sleep(fault.hold)
            target = _current_lsn(self.run.dsn)
            proxy.thaw()
        self.run.note(self.t0, f"{what} answers cdc run again")
        self._resumed(time.monotonic(), target, FREEZE_BOUND, own)

    def _resumed(self, since: float, target: int, bound: float, own: list[float | None] | None) -> None:
        """Note how long until the slot confirmed ``target`` (what was committed before the freeze or the
        thaw): the stream resumed. The time another outage held the stack meanwhile (the next one may begin
        before the stream has caught up) is not counted. A pipeline kill in between is counted, and adds its
        restart delay and KILL_ALLOWANCE to the bound. Watched for that bound and 10 s more of counted
        time."""
        base = bound
        while True:
            now = time.monotonic()
            blocked = self._blocked(since, now, own)
            took = now - since - blocked
            kills = [hold for at, hold in list(self._kills) if since <= at <= now]
            bound = base + sum(hold + KILL_ALLOWANCE for hold in kills)
            try:
                confirmed = _slot_confirmed(self.run.dsn, self.run.slot) >= target
            except psycopg.Error:
                confirmed = False
            if confirmed or took > bound + 10:
                break
            time.sleep(0.5)
        self.resumed.append((took if confirmed else float("inf"), bound))
        other = f" ({blocked:.1f} s more under another outage, not counted)" if blocked else ""
        if kills:
            other += f" ({len(kills)} kills of cdc run meanwhile: bound {bound:.1f} s)"
        self.run.note(
            self.t0, f"stream resumed after {took:.1f} s{other}" if confirmed else "stream NOT resumed"
        )

    def big_transaction(self, fault: Fault) -> None:
        self.run.note(self.t0, f"big transaction of {self.big_rows} rows begins")
        self.load.big_transaction(self.big_rows, f"{self.run.tag}-big")
        self.run.note(self.t0, f"big transaction: {'; '.join(self.load.stats.big)}")

    def advance_slot(self, fault: Fault) -> None:
        self.supervisor.pause()
        try:
            deadline = time.monotonic() + 30
            with psycopg.connect(self.run.dsn, autocommit=True, connect_timeout=5) as conn:
                while True:
                    try:
                        row = conn.execute(
                            "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())::text",
                            (self.run.slot,),
                        ).fetchone()
                        break
                    except psycopg.errors.ObjectInUse:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
            self.run.note(self.t0, f"SABOTAGE: slot advanced behind the pipeline's back to {row}")
        finally:
            self.supervisor.resume()


# -- the end of a run ---------------------------------------------------------------------------------------


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return parse_lsn(row[0]) if row and row[0] else 0


def _current_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(row[0])


def _wait_confirmed(run: Run, target: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _slot_confirmed(run.dsn, run.slot) >= target:
                return True
        except psycopg.Error:
            pass
        time.sleep(0.5)
    return False


def second_run(run: Run) -> tuple[bool, str]:
    """A new `cdc run` on the caught-up slot must publish nothing and stop cleanly."""
    topics = [*run.topics, run.dlq]
    before = {t: watermarks(run.bootstrap, t) for t in topics}
    log_path = run.dir / "second-run.log"
    proc = start_cdc_run(run.env, log_path)
    deadline = time.monotonic() + 60
    while "resuming after confirmed LSN" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            return False, f"did not start streaming (exit {proc.wait()})"
        time.sleep(0.2)
    time.sleep(5)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=90)
    after = {t: watermarks(run.bootstrap, t) for t in topics}
    match = re.search(r"stopped: (\d+) events published", log_path.read_text(errors="replace"))
    published = int(match.group(1)) if match else -1
    grew = [t for t in topics if after[t] != before[t]]
    ok = code == 0 and published == 0 and not grew
    return ok, f"exit {code}, {published} published, topics grown: {grew or 'none'}"


def one_run(
    stack: FaultStack, seed: int, args: argparse.Namespace, broker_proxy: TcpProxy | None
) -> tuple[bool, str]:
    started = time.monotonic()
    wall_start = datetime.now(UTC)
    run = prepare(stack, seed, args)
    if args.brokers == 1:
        schedule = make_schedule(
            seed,
            args.duration,
            registry=value_format(seed, args) == "confluent",
            big_rows=args.big_rows,
            sabotage=args.sabotage,
        )
    else:
        schedule = make_cluster_schedule(seed, args.duration, big_rows=args.big_rows, sabotage=args.sabotage)
    (run.dir / "schedule.txt").write_text("".join(f.describe() + "\n" for f in schedule))
    registry_port = int(run.registry_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = TcpProxy(("127.0.0.1", registry_port))
    proxy.start()
    run.env["CDC_SCHEMA_REGISTRY_URL"] = re.sub(r":\d+/", f":{proxy.port}/", run.registry_url, count=1)
    # cdc run reaches PostgreSQL through a proxy that can freeze its connections; the load, the faults and
    # the checks go straight to the server.
    pg_params = conninfo_to_dict(run.dsn)
    pg_proxy = TcpProxy((str(pg_params.get("host", "127.0.0.1")), int(pg_params.get("port", 5432))))
    pg_proxy.start()
    run.env["CDC_DATABASE_URL"] = make_conninfo(run.dsn, host="127.0.0.1", port=str(pg_proxy.port))
    log.info("run %s: seed %d, %d faults, logs in %s", run.tag, seed, len(schedule), run.dir)

    supervisor = Supervisor(run.env, run.dir)
    load = Load(run.dsn, run.table, seed=seed, rate=args.rate)
    faults = Faults(run, schedule, stack, supervisor, proxy, load, args.big_rows, pg_proxy, broker_proxy)
    supervisor.start()
    # The load begins 0-4 s after the pipeline: its first events meet a producer that is still acquiring
    # its producer id from a broker that is loading its coordinators, or one that has had it for a while.
    time.sleep(random.Random(seed).uniform(0, 4))
    t0 = time.monotonic()
    load.start()
    faults.start(t0)
    time.sleep(max(0.0, t0 + args.duration - time.monotonic()))
    run.note(t0, "end of the fault window: faults stop, then the load")
    faults.stop()
    load.stop()
    stack.up()  # whatever an overrunning fault left down comes back
    if not proxy.listening:
        proxy.start()
    proxy.thaw()
    pg_proxy.thaw()
    if broker_proxy is not None:
        broker_proxy.thaw()
    supervisor.resume()
    load.resolve_all()
    target = _current_lsn(run.dsn)
    catch_up = 300 + args.big_rows / 5_000
    caught_up = _wait_confirmed(run, target, catch_up)
    run.note(t0, f"slot {'confirmed past' if caught_up else 'NOT confirmed past'} {format_lsn(target)}")
    code = supervisor.stop()
    run.note(t0, f"SIGTERM: exit {code}")
    proxy.stop()
    pg_proxy.stop()
    run.env["CDC_DATABASE_URL"] = run.dsn  # the second run goes straight to the server, and so do the rest
    run.env["CDC_SCHEMA_REGISTRY_URL"] = run.registry_url  # (the registry's proxy is gone)

    deserializer = EventDeserializer(SCHEMAS, schema_registry_url=run.registry_url)
    try:
        records = [seen for topic in run.topics for seen in read_events(run.bootstrap, topic, deserializer)]
    finally:
        deserializer.close()
    dead = read_dead_letters(run.bootstrap, run.dlq)
    second_ok, second_text = second_run(run)
    run.note(t0, f"second cdc run: {second_text}")

    verdict = analyze(load.ledger, records, dead)
    audit = run_audit(run.env, wall_start - timedelta(minutes=1), verdict.missing, run.dsn, run.table)
    run.note(t0, f"cdc audit: {audit.text}")
    with psycopg.connect(run.dsn, autocommit=True) as conn:
        row = conn.execute(
            psycopg.sql.SQL("SELECT count(*) FROM {}").format(psycopg.sql.Identifier(run.table))
        )
        in_table = row.fetchone()[0]  # type: ignore[index]
    # Only when the run's audit was clean does it move the mark the scenario starts from.
    open_ok, open_text = (
        open_across_audit(run.env, run.dsn, run.table, run.slot, run.dir)
        if audit.agrees and not audit.expected_missing
        else (True, "not run: the run's audit was not clean")
    )
    run.note(t0, f"a transaction open across an audit: {open_text}")
    verdict.facts = {
        "sigterm_exit_0": code == 0,
        "slot_confirmed_past_last_event": caught_up,
        "second_run_publishes_nothing": second_ok,
        f"pipeline_kills>={MIN_PIPELINE_KILLS}": supervisor.kills >= MIN_PIPELINE_KILLS,
        "ledger_matches_table": in_table == verdict.committed,
        "every_fault_done": not faults.errors,
        "stream_resumed_within_the_bound_of_each_silence": all(t <= bound for t, bound in faults.resumed),
        "cdc_audit_finds_what_the_checker_finds": audit.agrees,
        "cdc_audit_judges_a_transaction_open_across_it_later": open_ok,
    }
    if args.delivery == "exactly-once":
        verdict.facts["no_duplicates_for_read_committed"] = verdict.duplicates == 0
    line = figure_line(run, verdict, faults, supervisor, schedule, args, time.monotonic() - started)
    line += f" {audit.figure()}"
    violations = verdict.violations()
    exits = [f"exit of start {e.start}: code {e.code}: {e.reason}" for e in supervisor.unexpected_exits()]
    (run.dir / "faults.log").write_text(
        "\n".join([*run.done, *exits, *faults.errors, *violations, line]) + "\n"
    )
    (run.dir / "verdict.json").write_text(
        json.dumps(
            {"missing": verdict.missing, "order": verdict.order_violations, "violations": violations},
            indent=1,
        )
    )
    for exit_ in supervisor.unexpected_exits():
        log.info(
            "unexpected exit of start %d: code %d after %.1f s: %s",
            exit_.start,
            exit_.code,
            exit_.lived,
            exit_.reason or "(no error line)",
        )
    if violations:
        for text in violations:
            log.error("VIOLATION: %s", text)
        log.error("run kept in %s", run.dir)
    else:
        _cleanup(run, keep=args.keep)
    return not violations, line


def figure_line(
    run: Run,
    v: Verdict,
    faults: Faults,
    supervisor: Supervisor,
    schedule: list[Fault],
    args: argparse.Namespace,
    elapsed: float,
) -> str:
    planned = counts(schedule)
    done = faults.done
    cluster = ""
    if args.brokers != 1:
        cluster = (
            f"brokers={args.brokers} "
            + "".join(f"{k}={done.get(k, 0)}/{planned.get(k, 0)} " for k in CLUSTER_OUTAGES)
            + f"isr_low={faults.isr_low:.1f}s isr_low_committed={faults.isr_low_committed} "
            f"isr_low_refusals={faults.isr_low_refusals} "
            f"in_sync_max={faults.in_sync_max:.1f}s "
        )
    return (
        f"faults: seed={run.seed} result={'FAIL' if v.violations() else 'PASS'} missing={len(v.missing)} "
        f"broker={broker_mode(run.seed, args)} format={value_format(run.seed, args)} "
        f"delivery={args.delivery} {cluster}"
        f"duplicates={v.duplicates} committed={v.committed} rolled_back={v.rolled_back} records={v.records} "
        f"rolled_back_seen={len(v.rolled_back_seen)} order={len(v.order_violations)} "
        f"split_keys={len(v.split_keys)} dead_letters={v.dead_letters} "
        f"kills={supervisor.kills} broker_kills={done.get('kill_broker', 0)} "
        f"pg_restarts={done.get('restart_postgres', 0)} walsender_kills={done.get('kill_walsender', 0)} "
        f"registry_outages={done.get('registry_down', 0)}/{planned.get('registry_down', 0)} "
        f"registry_freezes={done.get('freeze_registry', 0)}/{planned.get('freeze_registry', 0)} "
        f"pg_freezes={done.get('freeze_pg', 0)}/{planned.get('freeze_pg', 0)} "
        f"pg_freezes_all={done.get('freeze_pg_all', 0)}/{planned.get('freeze_pg_all', 0)} "
        f"broker_freezes={done.get('freeze_broker', 0)}/{planned.get('freeze_broker', 0)} "
        f"broker_freezes_all={done.get('freeze_broker_all', 0)}/{planned.get('freeze_broker_all', 0)} "
        f"resumed_max={max((t for t, _ in faults.resumed), default=0):.1f}s "
        f"big_rows={args.big_rows if done.get('big_transaction') else 0} "
        f"unexpected_exits={len(supervisor.unexpected_exits())} "
        f"duration={args.duration:g}s elapsed={elapsed:.0f}s"
    )


def _forget_position(conn: psycopg.Connection[Any], slot: str) -> None:
    """What `cdc teardown` does beside dropping the slot: its row of cdc_checkpoint goes too."""
    if conn.execute("SELECT to_regclass('public.cdc_checkpoint')").fetchone() != (None,):
        conn.execute("DELETE FROM public.cdc_checkpoint WHERE slot = %s", (slot,))


def _cleanup(run: Run, *, keep: bool) -> None:
    with psycopg.connect(run.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (run.slot,))
        _forget_position(conn, run.slot)
        conn.execute(
            psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(psycopg.sql.Identifier(run.slot))
        )
        conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(psycopg.sql.Identifier(run.table)))
    if not keep:
        shutil.rmtree(run.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="replays a schedule (default: a random one, printed)")
    parser.add_argument("--duration", type=float, default=200, help="seconds of load and faults per run")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row, seeds seed, seed+1, ...")
    parser.add_argument(
        "--big-rows", type=int, default=1_000_000, help="rows of the big transaction (0: none)"
    )
    parser.add_argument("--rate", type=float, default=20, help="load transactions per second")
    parser.add_argument(
        "--value-format",
        choices=("auto", "confluent", "single-object"),
        default="auto",
        help="auto: single-object for odd seeds, confluent (with a registry outage) for even ones",
    )
    parser.add_argument(
        "--log-level", default="DEBUG", help="cdc run's log level (DEBUG: a line per delivery)"
    )
    parser.add_argument("--sabotage", action="store_true", help="advance the slot behind the pipeline's back")
    parser.add_argument(
        "--broker",
        choices=("auto", "fresh", "restart"),
        default="auto",
        help="start each run's broker on wiped storage, or restart it on the storage of earlier runs",
    )
    parser.add_argument(
        "--delivery",
        choices=("at-least-once", "exactly-once"),
        default="at-least-once",
        help="exactly-once: Kafka transactions; a read_committed reader must see no duplicate",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="3: a three-broker cluster (RF 3, min.insync.replicas 2) and the cluster's faults",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs of passing runs too")
    parser.add_argument("--keep-stack", action="store_true", help="leave the fault stack running at the end")
    args = parser.parse_args(argv)
    crash_dumps()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    print(f"faults: seed {seed}, {args.runs} run(s) of {args.duration:g} s", flush=True)
    stack = FaultStack(brokers=args.brokers)
    lines, passed = [], 0
    # Every client reaches the single broker through this proxy (the broker advertises its port): it
    # outlives the broker's restarts, as a network does. The cluster's clients connect to its brokers.
    broker_proxy = None
    if args.brokers == 1:
        broker_proxy = TcpProxy(stack.kafka_target)
        broker_proxy.port = stack.kafka_advertised_port
    # The fault stack's daemons are not our children: brought down by a watchdog if this process is killed.
    guard = None if args.keep_stack else watchdog(["bash", str(STACK_SCRIPT), "down"], stack.script_env)
    try:
        try:
            if broker_proxy is not None:
                broker_proxy.start()
            stack.up()
        except (RuntimeError, OSError) as exc:
            print(f"faults: the fault stack did not start: {exc}", file=sys.stderr)
            return 2
        for i in range(args.runs):
            ok, line = one_run(stack, seed + i, args, broker_proxy)
            passed += ok
            lines.append(line)
            print(line, flush=True)
    finally:
        if broker_proxy is not None:
            broker_proxy.stop()
        if not args.keep_stack:
            try:
                stack.down()
            except RuntimeError as exc:
                print(f"faults: {exc}", file=sys.stderr)
        if guard is not None:
            guard.disarm()
    if args.runs > 1:
        missing = sum(int(re.search(r"missing=(\d+)", line).group(1)) for line in lines)  # type: ignore[union-attr]
        print(
            f"faults: {passed} of {args.runs} runs passed, seeds {seed}..{seed + args.runs - 1}, "
            f"missing={missing} in all",
            flush=True,
        )
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

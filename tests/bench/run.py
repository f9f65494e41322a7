"""`make bench`: the end-to-end benchmark of outbox CDC on the local stack.

Phases, all in one run so that their ratios are measured side by side on the same (noisy) machine:

1. set-up: a fresh database (``--database``, dropped and re-created), the outbox table and publication of
   ``cdc setup``, one pgoutput slot per relay and repetition, all created before any insert so that every
   relay reads the same WAL; one topic per throughput pass (``--partitions``, LogAppendTime: the broker
   stamps each record when it appends it), and the latency phase's topics (CreateTime: the pipeline's
   commit time).
2. fill: ``--events`` OrderPlaced v1 rows in transactions of 100, committed by a procedure, no relay running.
3. throughput: each relay drains its own pre-filled slot, one after another, the order alternating across
   ``--repeat``: the bare reader (``tests.bench.bare_reader``, the ceiling: it only counts Inserts, in a
   process of its own), ``cdc run`` at-least-once and ``cdc run`` with ``delivery = exactly-once``. Each is
   measured as ``make bench-debezium`` measures its relays (``tests.bench.measure``): rate = N / (the
   LogAppendTime of the last record - of the first), every record read back and its event id counted; CPU =
   utime + stime of the relay's process (all its threads) between the first and the last arrival, per event
   arrived in between, and all its walsender spent until the last arrival, per event; peak RSS = VmHWM. All
   relays connect to PostgreSQL the same way (``--unix-socket`` or CDC_DATABASE_URL's host): the transport
   is in the report.
4. latency: a pipeline caught up on its slot, a separate process inserting 100-row transactions every 10 ms
   (``--latency-rate``) for ``--latency-seconds``, and a consumer in this process measuring receive time minus
   record timestamp (= commit time) per record; for at-least-once, then for exactly-once.
5. tracing (``tests.bench.tracing``, ``--tracing-events``): ``cdc run`` with tracing off, with 1 % of rows
   sampled and with 100 %, each draining a slot of rows that carry a ``traceparent``: events/s and CPU µs per
   event against off.
6. results: JSON (``--output``) and a summary on stdout. Clean-up (pipeline, slots, database, topics)
   always runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue as queue_module
import re
import secrets
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg.conninfo import conninfo_to_dict

from cdc.config_loader import load_settings
from cdc.ops import setup as cdc_setup
from tests.bench import db
from tests.bench.latency import LatencyConsumer, per_second, percentiles
from tests.bench.load import bulk_fill, insert_marked, paced_load
from tests.bench.measure import bare_drain, measure_drain
from tests.bench.procs import MachineCpu, PipelineProcess, Sampler, cpu_seconds, summarize_rss
from tests.bench.profiles import cprofile_top, pyspy_top
from tests.bench.report import LABELS, RELAYS, TARGETS, summary, throughput, verdicts
from tests.bench.tracing import lines as tracing_lines
from tests.bench.tracing import tracing_phase
from tests.children import crash_dumps
from tests.kafka_admin import create_topics, delete_topics

ROOT = Path(__file__).resolve().parents[2]
PUBLICATION = "bench_outbox"


class BenchError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, help="events of the throughput phase (default 1 000 000)")
    p.add_argument("--quick", action="store_true", help="100 000 events and a 10 s latency phase")
    p.add_argument("--rows-per-txn", type=int, default=100, help="rows per transaction (default 100)")
    p.add_argument("--aggregates", type=int, default=500, help="distinct aggregate ids (default 500)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the bench topic (default 6)")
    p.add_argument("--repeat", type=int, default=1, help="throughput repetitions, order alternating")
    p.add_argument("--latency-seconds", type=float, help="length of the latency phase (default 20, 0 = skip)")
    p.add_argument("--latency-rate", type=float, default=10_000, help="offered events/s (default 10 000)")
    p.add_argument(
        "--loader-connections",
        type=int,
        default=4,
        help="connections of the paced loader, so a slow commit does not hold up the schedule (default 4)",
    )
    p.add_argument(
        "--value-format",
        choices=("single-object", "confluent"),
        default="single-object",
        help="the pipeline's framing; confluent uses CDC_SCHEMA_REGISTRY_URL (default single-object)",
    )
    p.add_argument(
        "--exactly-once",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure delivery = exactly-once (its own slot and topic), side by side (default on)",
    )
    p.add_argument(
        "--unix-socket",
        action="store_true",
        help="every relay connects over the server's Unix socket (its first unix_socket_directories) instead "
        "of CDC_DATABASE_URL's host; the stack's URL is TCP",
    )
    p.add_argument(
        "--tracing-events",
        type=int,
        help="events per pass of the tracing phase: off, 1%% and 100%% sampled (default 200 000, 0: skip)",
    )
    p.add_argument("--database", default="cdc_bench", help="bench database, dropped and re-created")
    p.add_argument("--output", type=Path, help="JSON file (default bench-results/bench-<timestamp>.json)")
    p.add_argument(
        "--profile",
        choices=("none", "cprofile", "py-spy"),
        default="none",
        help="profile the first pipeline throughput pass (its rate is then not comparable)",
    )
    args = p.parse_args(argv)
    if args.events is None:
        args.events = 100_000 if args.quick else 1_000_000
    if args.latency_seconds is None:
        args.latency_seconds = 10.0 if args.quick else 20.0
    if args.tracing_events is None:
        args.tracing_events = min(args.events, 200_000)
    if args.events <= 0 or args.events % args.rows_per_txn:
        p.error(f"--events must be a positive multiple of --rows-per-txn ({args.rows_per_txn})")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.value_format == "confluent" and not os.environ.get("CDC_SCHEMA_REGISTRY_URL"):
        p.error("--value-format confluent needs CDC_SCHEMA_REGISTRY_URL (. .stack/env)")
    return args


def machine_info(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    row = admin.execute("SHOW server_version").fetchone()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": row[0] if row else None,
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "confluent_kafka": _first(confluent_kafka.version()),
        "librdkafka": _first(confluent_kafka.libversion()),
    }


def _first(version: object) -> str:
    """confluent_kafka's version() and libversion() give (text, number); some versions give the text only."""
    return str(version[0] if isinstance(version, tuple) else version)


def kafka_pid() -> int | None:
    try:
        return int((ROOT / ".stack" / "kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cores(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0:
        return None
    return round((after - before) / seconds, 2)


ACK_LINE = re.compile(r"commit-to-ack over (\d+) events: p50 (\d+) ms, p99 (\d+) ms, max (\d+) ms")


def _pipeline_ack_latency(path: Path) -> dict[str, Any]:
    """The pipeline's own commit-to-ack figures, logged at its shutdown (last one wins)."""
    try:
        found = ACK_LINE.findall(path.read_text(errors="replace"))
    except OSError:
        return {}
    if not found:
        return {}
    count, p50, p99, top = (int(x) for x in found[-1])
    return {"count": count, "p50_ms": p50, "p99_ms": p99, "max_ms": top}


def _log_findings(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if " WARNING " in line or " ERROR " in line or "Traceback" in line][:20]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = time.strftime("%Y%m%d%H%M%S") + secrets.token_hex(2)
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.output = args.output or Path("bench-results") / f"bench-{self.stamp}.json"
        self.output.parent.mkdir(parents=True, exist_ok=True)
        admin_dsn = os.environ.get("CDC_DATABASE_URL")
        bootstrap = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
        if not admin_dsn or not bootstrap:
            raise BenchError("CDC_DATABASE_URL and CDC_KAFKA_BOOTSTRAP_SERVERS must be set (. .stack/env)")
        self.admin_dsn = admin_dsn
        self.bootstrap = bootstrap
        self.bench_dsn = db.dsn_for(admin_dsn, args.database)
        self.topic = f"bench.{self.run_id}.order"
        self.dlq_topic = f"bench.{self.run_id}.dlq"
        # A slot per relay and repetition, all made before the fill: every pass drains the same WAL.
        relays = [r for r in RELAYS if args.exactly_once or r != "cdc-eo"]
        self.slots = {
            r: [f"bench_{self.run_id}_{r.replace('-', '_')}_{i}" for i in range(args.repeat)] for r in relays
        }
        self.eo_topic = f"bench.{self.run_id}.eo.order"
        self.next_row = 0  # generator index of the next row, so every event differs
        self.extra_events = 0  # warm-up and marker rows of the latency phase
        self.kafka_pid = kafka_pid()
        self.result: dict[str, Any] = {
            "run_id": self.run_id,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "targets": TARGETS,
            "notes": [],
        }
        self._admin: psycopg.Connection[Any] | None = None
        self._watch: db.SlotWatch | None = None
        self._kafka_admin = AdminClient({"bootstrap.servers": bootstrap})
        self._pipelines: list[PipelineProcess] = []
        self._consumer: LatencyConsumer | None = None
        self._loader: Any = None
        self._topics_created: list[str] = []

    # -- phases ----------------------------------------------------------------------------------------

    def run(self) -> None:
        a = self.args
        self._admin = db.connect(self.admin_dsn)
        if a.unix_socket:
            (directories,) = self._admin.execute("SHOW unix_socket_directories").fetchone() or ("",)
            directory = directories.split(",")[0].strip()
            if not directory.startswith("/"):
                raise BenchError(f"the server has no Unix socket directory to use: {directories!r}")
            self.bench_dsn = db.with_host(self.bench_dsn, directory)
        self.result["machine"] = machine_info(self._admin)
        self.result["config"] = {
            "events": a.events,
            "rows_per_txn": a.rows_per_txn,
            "aggregates": a.aggregates,
            "partitions": a.partitions,
            "repeat": a.repeat,
            "latency_seconds": a.latency_seconds,
            "latency_rate": a.latency_rate,
            "loader_connections": a.loader_connections,
            "database": a.database,
            "topic": self.topic,
            "profile": a.profile,
            "value_format": a.value_format,
            "exactly_once": a.exactly_once,
            "transport": db.transport(str(conninfo_to_dict(self.bench_dsn).get("host") or "")),
        }
        self.prepare()
        self._progress("fill", f"inserting {a.events:,} events")
        fill = bulk_fill(
            self.bench_dsn, events=a.events, rows_per_txn=a.rows_per_txn, aggregates=a.aggregates
        )
        self.next_row = a.events
        self.result["fill"] = fill
        self._progress("fill", f"{fill['seconds']:.1f} s, WAL {fill['wal_bytes'] / 2**20:,.0f} MiB")
        target = fill["target_lsn"]

        runs: list[dict[str, Any]] = []
        self.result["throughput"] = {"runs": runs}
        for rep in range(a.repeat):
            order = list(self.slots) if rep % 2 == 0 else list(reversed(self.slots))
            for relay in order:
                runs.append(self.bare_pass(rep) if relay == "bare" else self.relay_pass(rep, relay, target))
        self.result["throughput"] = {"runs": runs, **throughput(runs)}
        failed = [f"{r['relay']} #{r['repetition']}: {r.get('error')}" for r in runs if not r.get("ok")]
        if failed:
            raise BenchError(f"passes that did not deliver all {a.events:,} events: {'; '.join(failed)}")
        if a.profile != "none":
            self.result["notes"].append(
                "pass 0 of cdc run (at-least-once) ran under the profiler"
                + (
                    " and is left out of the median"
                    if a.repeat > 1
                    else ": its rate and ratio are not comparable"
                )
            )

        if a.latency_seconds > 0:
            self.result["latency"] = self.latency_phase()
            if a.exactly_once:
                self.result["latency_exactly_once"] = self.latency_phase(delivery="exactly-once")
        self.result["kafka_check"] = self.kafka_check()
        if a.tracing_events:  # last: its fills must not reach the latency phase's slot
            self.result["tracing"] = tracing_phase(self, a.tracing_events)

    def prepare(self) -> None:
        a = self.args
        admin = self._admin
        assert admin is not None
        self._progress("setup", f"database {a.database}, slots, topics {self.topic} / {self.dlq_topic}")
        db.recreate_database(admin, a.database)
        with db.connect(self.bench_dsn) as conn:
            conn.execute(db.generator_sql())
        slots = [slot for per_relay in self.slots.values() for slot in per_relay]
        settings = load_settings(config_file=None, environ=self.pipeline_env(slots[0]), overrides={})
        outcomes = cdc_setup.apply(settings)
        self.result["setup"] = dict(outcomes)
        with db.connect(self.bench_dsn) as conn:
            for slot in slots[1:]:
                db.create_slot(conn, slot)
        self._watch = db.SlotWatch(self.admin_dsn)
        topics = [NewTopic(self.topic, num_partitions=a.partitions, replication_factor=1)]
        # The throughput passes' topics: the broker's clock at each append gives their rate.
        appended = {"message.timestamp.type": "LogAppendTime"}
        for relay in self.slots:
            if relay != "bare":
                topics += [
                    NewTopic(self.pass_topic(relay, rep), a.partitions, replication_factor=1, config=appended)
                    for rep in range(a.repeat)
                ]
        topics.append(NewTopic(self.dlq_topic, num_partitions=1, replication_factor=1))
        if a.exactly_once:
            topics.append(NewTopic(self.eo_topic, num_partitions=a.partitions, replication_factor=1))
            topics.append(
                NewTopic(
                    f"bench.{self.run_id}.checkpoints",
                    num_partitions=1,
                    replication_factor=1,
                    config={"cleanup.policy": "compact"},
                )
            )
        self._topics_created += [t.topic for t in topics]  # deleted at the end if they exist
        create_topics(self._kafka_admin, topics)

    def pass_prefix(self, relay: str, rep: int) -> str:
        return f"bench.{self.run_id}.{relay}-{rep}"

    def pass_topic(self, relay: str, rep: int) -> str:
        return f"{self.pass_prefix(relay, rep)}.order"  # every bench row has aggregate_type 'order'

    def pipeline_env(
        self, slot: str, delivery: str = "at-least-once", topic_prefix: str | None = None
    ) -> dict[str, str]:
        eo = delivery == "exactly-once"
        if topic_prefix is None:  # the latency phase's
            topic_prefix = f"bench.{self.run_id}.eo" if eo else f"bench.{self.run_id}"
        env = {k: v for k, v in os.environ.items() if k != "CDC_CONFIG"}
        env.update(
            CDC_DATABASE_URL=self.bench_dsn,
            CDC_SLOT=slot,
            CDC_PUBLICATION=PUBLICATION,
            CDC_TABLE=db.TABLE,
            CDC_TOPIC_TEMPLATE=f"{topic_prefix}.{{aggregate_type}}",
            CDC_DLQ_TOPIC=self.dlq_topic,
            CDC_TOPIC_PARTITIONS=str(self.args.partitions),
            CDC_SCHEMAS_DIR=str(ROOT / "schemas"),
            CDC_VALUE_FORMAT=self.args.value_format,
            CDC_LOG_LEVEL="INFO",  # a handful of lifecycle lines, and the commit-to-ack summary at exit
        )
        if eo:
            env.update(
                CDC_DELIVERY=delivery,
                CDC_CHECKPOINT_TOPIC=f"bench.{self.run_id}.checkpoints",
            )
        return env

    def start_pipeline(
        self,
        slot: str,
        name: str,
        profile: str = "none",
        delivery: str = "at-least-once",
        topic_prefix: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> PipelineProcess:
        base = self.output.with_name(f"bench-{self.stamp}-{name}")
        cprofile_out = base.with_suffix(".prof") if profile == "cprofile" else None
        pyspy_out = base.with_suffix(".py-spy.txt") if profile == "py-spy" else None
        proc = PipelineProcess(
            {**self.pipeline_env(slot, delivery, topic_prefix), **(extra or {})},
            base.with_suffix(".log"),
            ROOT,
            cprofile_out=cprofile_out,
            pyspy_out=pyspy_out,
        )
        self._pipelines.append(proc)
        return proc

    # What a phase of another module asks of the bench (tests.bench.tracing).

    @property
    def kafka_admin(self) -> AdminClient:
        return self._kafka_admin

    def create_topics(self, topics: list[NewTopic]) -> None:
        for name, future in self._kafka_admin.create_topics(topics, operation_timeout=30).items():
            future.result(timeout=60)
            self._topics_created.append(name)

    def progress(self, phase: str, message: str) -> None:
        self._progress(phase, message)

    def walsender(self, slot: str) -> int | None:
        assert self._watch is not None
        active, pid, _ = self._watch.state(slot)
        return pid if active else None

    def slot_confirmed(self, slot: str, target: int) -> bool:
        assert self._watch is not None
        return self._watch.state(slot)[2] >= target

    def forget_pipeline(self, proc: PipelineProcess) -> None:
        """A pipeline measure_drain stopped."""
        self._pipelines.remove(proc)

    def stop_pipeline(self, proc: PipelineProcess) -> dict[str, Any]:
        outcome = proc.stop()
        self._pipelines.remove(proc)
        return outcome

    def relay_pass(self, rep: int, relay: str, target: int) -> dict[str, Any]:
        """``cdc run`` (``relay`` cdc: at-least-once, cdc-eo: exactly-once) drains its pre-filled slot into a
        topic of its own."""
        a = self.args
        watch = self._watch
        assert watch is not None
        eo = relay == "cdc-eo"
        delivery = "exactly-once" if eo else "at-least-once"
        slot = self.slots[relay][rep]
        profile = a.profile if rep == 0 and not eo else "none"
        self._progress(
            relay,
            f"pass {rep}: draining {a.events:,} events" + (f" under {profile}" if profile != "none" else ""),
        )
        proc = self.start_pipeline(
            slot, f"{relay}-{rep}", profile, delivery, topic_prefix=self.pass_prefix(relay, rep)
        )
        sampler = Sampler(proc.pid)
        sampler.start()

        def alive() -> None:
            if proc.exited() is not None:
                raise BenchError(
                    f"cdc run exited with code {proc.exited()} in pass {rep}:\n{proc.log_tail()}"
                )

        def walsender() -> int | None:
            active, pid, _ = watch.state(slot)
            return pid if active else None

        def confirmed() -> bool:
            return watch.state(slot)[2] >= target

        measured = measure_drain(
            proc,
            kafka_admin=self._kafka_admin,
            bootstrap=self.bootstrap,
            topic=self.pass_topic(relay, rep),
            partitions=a.partitions,
            events=a.events,
            walsender_pid=walsender,
            alive=alive,
            start_timeout=120,
            drain_timeout=max(300.0, a.events / 1000),
            # Kafka transactions: the offsets count commit markers too; the slot passes the end of the
            # fill only once the transaction holding its last event committed.
            delivered=confirmed if eo else None,
            kafka_pid=self.kafka_pid,
        )
        self._pipelines.remove(proc)
        samples = sampler.stop()
        window_start = measured["first_record_after_start_s"]
        run = {
            "relay": relay,
            "label": LABELS[relay],
            "repetition": rep,
            "delivery": delivery,
            **measured,
            "rss": summarize_rss(
                samples, start=window_start, end=window_start + measured["cpu_window"]["seconds"]
            ),
            "log": str(proc.log_path),
            "log_findings": _log_findings(proc.log_path),
            "profiled": profile != "none",
        }
        self._progress(
            relay,
            f"pass {rep}: {run['events_per_s'] or 0:,} events/s, {run['cpu_us_per_event']} CPU µs/event "
            f"(walsender {run['walsender_cpu_us_per_event']}), VmHWM {run['peak_rss_mb']} MB",
        )
        if profile == "cprofile" and proc.log_path.with_suffix(".prof").exists():
            self.result["profile"] = cprofile_top(proc.log_path.with_suffix(".prof"))
        elif profile == "py-spy" and proc.log_path.with_suffix(".py-spy.txt").exists():
            self.result["profile"] = pyspy_top(proc.log_path.with_suffix(".py-spy.txt"))
        elif profile != "none":
            self.result["notes"].append(f"{profile} wrote no profile; see {proc.log_path}")
        return run

    def bare_pass(self, rep: int) -> dict[str, Any]:
        a = self.args
        self._progress("bare", f"pass {rep}: reading {a.events:,} inserts")
        run = bare_drain(
            self.bench_dsn,
            slot=self.slots["bare"][rep],
            publication=PUBLICATION,
            events=a.events,
            timeout=max(300.0, a.events / 1000),
        )
        run = {"relay": "bare", "label": LABELS["bare"], "repetition": rep, **run}
        self._progress(
            "bare",
            f"pass {rep}: {run['events_per_s'] or 0:,} events/s, {run['cpu_us_per_event']} CPU µs/event "
            f"(walsender {run['walsender_cpu_us_per_event']}) over {run['transport']}",
        )
        return run

    def latency_phase(self, delivery: str = "at-least-once") -> dict[str, Any]:
        a = self.args
        watch = self._watch
        assert watch is not None
        eo = delivery == "exactly-once"
        # A slot that its throughput pass left caught up.
        slot = self.slots["cdc-eo" if eo else "cdc"][-1]
        phase = "latency (exactly-once)" if eo else "latency"
        self._progress(phase, f"{a.latency_rate:,.0f} events/s for {a.latency_seconds:g} s")
        proc = self.start_pipeline(slot, "latency-eo" if eo else "latency", delivery=delivery)
        sampler = Sampler(proc.pid)
        sampler.start()
        deadline = time.monotonic() + 60
        while not watch.state(slot)[0]:
            if proc.exited() is not None:
                raise BenchError(f"the pipeline exited with code {proc.exited()}:\n{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise BenchError("the pipeline did not start streaming within 60 s")
            time.sleep(0.1)
        wal_pid = watch.state(slot)[1]
        topic = self.eo_topic if eo else self.topic
        consumer = self._consumer = LatencyConsumer(self.bootstrap, topic, f"bench-{self.run_id}-{delivery}")
        consumer.start()
        if not consumer.ready.wait(30) or consumer.errors:
            raise BenchError(f"the latency consumer did not start: {consumer.errors}")
        # Warm-up: one transaction through the whole path proves the pipeline and the consumer are live.
        with db.connect(self.bench_dsn) as conn:
            lsn = insert_marked(conn, first=self.next_row, rows=a.rows_per_txn, aggregates=a.aggregates)
        self.next_row += a.rows_per_txn
        if not eo:  # the count check is of the at-least-once topic
            self.extra_events += a.rows_per_txn
        watch.wait_confirmed(slot, lsn, 60)
        if not consumer.wait_count(a.rows_per_txn, 60):
            raise BenchError(f"the warm-up records did not reach the consumer: {consumer.errors}")
        # The slot may have held the other latency phase's load (every slot sees every insert): the pipeline
        # has published it by now, and the consumer may still be reading it. Those records are not the load's.
        if not consumer.wait_quiet(1.0, 60):
            raise BenchError(f"the latency consumer did not catch up with the topic: {consumer.errors}")
        base = consumer.count

        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        cpu0 = {
            "pipeline": cpu_seconds(proc.pid),
            "walsender": cpu_seconds(wal_pid),
            "kafka": cpu_seconds(self.kafka_pid),
            "bench_process": cpu_seconds(os.getpid()),
        }
        machine = MachineCpu()
        t0, wall0 = time.monotonic(), time.time()
        loader = self._loader = ctx.Process(
            target=paced_load,
            args=(
                self.bench_dsn,
                a.latency_rate,
                a.rows_per_txn,
                a.latency_seconds,
                self.next_row,
                a.aggregates,
                a.loader_connections,
                queue,
                os.getpid(),
            ),
            name="bench-loader",
        )
        loader.start()
        offered = _result_of(loader, queue, a.latency_seconds + 120)
        loader.join(30)
        self._loader = None
        if "error" in offered:
            raise BenchError(f"the paced loader failed: {offered['error']}")
        self.next_row += offered["events"]
        received_all = consumer.wait_count(base + offered["events"], 120)
        t_received = time.monotonic()
        cpu1 = {
            "pipeline": cpu_seconds(proc.pid),
            "walsender": cpu_seconds(wal_pid),
            "kafka": cpu_seconds(self.kafka_pid),
            "bench_process": cpu_seconds(os.getpid()),
        }
        machine_cpu = machine.read()
        # A last one-row transaction: the slot confirms it only after everything before it.
        with db.connect(self.bench_dsn) as conn:
            lsn = insert_marked(conn, first=self.next_row, rows=1, aggregates=a.aggregates)
        self.next_row += 1
        if not eo:
            self.extra_events += 1
        marker_confirmed = watch.wait_confirmed(slot, lsn, 120) - t_received
        consumer.stop()
        self._consumer = None
        samples = sampler.stop()
        stop = self.stop_pipeline(proc)
        latencies = consumer.latencies_ms[base : base + offered["events"]]
        window = t_received - t0
        load_start, load_end = t0 - proc.started, t_received - proc.started
        result = {
            "offered": offered,
            "commit_to_consume": percentiles(latencies),
            "commit_to_ack": _pipeline_ack_latency(proc.log_path),
            "per_second": per_second(latencies, consumer.received_at[base : base + len(latencies)], wall0),
            "received_all": received_all,
            "consumer_errors": consumer.errors[:10],
            "all_received_after_load_s": round(t_received - t0 - offered["seconds"], 3),
            "slot_confirmed_marker_after_s": round(marker_confirmed, 3),
            "cpu_cores": {
                **{k: _cores(cpu0[k], cpu1[k], window) for k in cpu0},
                "loader_process": round(offered.get("loader_cpu_seconds", 0) / window, 2),
                **machine_cpu,
            },
            "rss": summarize_rss(samples, start=load_start, end=load_end),
            "stop": stop,
            "log": str(proc.log_path),
            "log_findings": _log_findings(proc.log_path),
            "method": "receive time (bench process, when poll() returned the record or the batch it came "
            "in) minus the Kafka record timestamp, which the pipeline sets to the transaction's commit time "
            "(ms, truncated): an upper bound of commit-to-ack. commit_to_ack is the pipeline's own figure: "
            "for each transaction, the time its last event was acknowledged minus its commit time, counted "
            "for each of its events (an upper bound per event, without the consumer's fetch)",
        }
        c = result["commit_to_consume"]
        self._progress(phase, f"p50 {c.get('p50_ms')} ms, p99 {c.get('p99_ms')} ms, max {c.get('max_ms')} ms")
        return result

    def kafka_check(self) -> dict[str, Any]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{self.run_id}-check"})
        try:
            counts = {}
            for topic in (self.topic, self.dlq_topic):
                meta = consumer.list_topics(topic, timeout=10).topics[topic]
                total = 0
                for p in meta.partitions:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    total += high - low
                counts[topic] = total
        finally:
            consumer.close()
        # The throughput passes were counted in their own topics; this is the latency phase's.
        lat = self.result.get("latency", {})
        expected = self.extra_events + lat.get("offered", {}).get("events", 0)
        check = {"records": counts[self.topic], "expected": expected, "dlq_records": counts[self.dlq_topic]}
        if self.args.exactly_once:
            with_markers = Consumer(
                {"bootstrap.servers": self.bootstrap, "group.id": f"bench-{self.run_id}-eo"}
            )
            try:
                meta = with_markers.list_topics(self.eo_topic, timeout=10).topics[self.eo_topic]
                check["exactly_once_offsets"] = sum(
                    high - low
                    for low, high in (
                        with_markers.get_watermark_offsets(TopicPartition(self.eo_topic, p), timeout=10)
                        for p in meta.partitions
                    )
                )
            finally:
                with_markers.close()
            check["exactly_once_note"] = (
                "offsets, not records: each committed transaction adds a commit marker"
            )
        return check

    # -- clean-up --------------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        problems = []

        def attempt(what: str, action: Any) -> None:
            try:
                action()
            except Exception as exc:  # keep cleaning up; report at the end
                problems.append(f"{what}: {type(exc).__name__}: {exc}")

        for proc in list(self._pipelines):
            attempt("stop pipeline", lambda proc=proc: self.stop_pipeline(proc))
        if self._loader is not None:
            attempt("stop loader", lambda: (self._loader.terminate(), self._loader.join(10)))
        if self._consumer is not None:
            attempt("stop consumer", self._consumer.stop)
        if self._watch is not None:
            attempt("close slot watch", self._watch.close)
        if self._admin is not None:
            attempt("drop database and slots", lambda: db.drop_database(self._admin, self.args.database))
            attempt("close admin connection", self._admin.close)
        if self._topics_created:
            attempt("delete topics", lambda: delete_topics(self._kafka_admin, self._topics_created))
        return problems

    @staticmethod
    def _progress(phase: str, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {phase}: {message}", file=sys.stderr, flush=True)


def _result_of(process: Any, queue: Any, timeout: float) -> dict[str, Any]:
    """The dict a child process puts on ``queue``; fails early when the child dies without one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result: dict[str, Any] = queue.get(timeout=0.5)
            return result
        except queue_module.Empty:
            if not process.is_alive():
                raise BenchError(
                    f"the paced loader exited with code {process.exitcode} and no result"
                ) from None
            if time.monotonic() > deadline:
                raise BenchError(f"the paced loader gave no result within {timeout:g} s") from None


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    crash_dumps()
    signal.signal(signal.SIGTERM, _interrupt)
    bench = Bench(args)
    code = 0
    try:
        bench.run()
    except (Exception, KeyboardInterrupt) as exc:
        code = 1
        bench.result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        problems = bench.cleanup()
        if problems:
            bench.result["cleanup_problems"] = problems
            code = code or 1
    bench.result["verdicts"] = verdicts(bench.result)
    bench.result["output"] = str(bench.output)
    bench.output.write_text(json.dumps(bench.result, indent=2) + "\n")
    print("\n".join(summary(bench.result) + tracing_lines(bench.result.get("tracing", {}))))
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The run of `make bench-debezium`: set-up, fill, one drain per relay, results, clean-up.

1. set-up: a fresh database (``--database``), the outbox table and publication of ``cdc setup``, one pgoutput
   slot per relay, and one topic per relay (``--partitions``, ``message.timestamp.type = LogAppendTime``, so
   that the broker stamps each record with its own clock when it appends it), all before any row exists.
2. fill: ``--events`` outbox rows in transactions of ``--rows-per-txn``; no relay runs.
3. one after another, each relay drains its own slot into its own topic: the bare reader (in a process
   of its own, counting inserts; ``tests.bench.bare_reader``), ``cdc run``, then Kafka Connect standalone
   with Debezium in each variant of ``config.VARIANTS``. While a relay runs, the topic's watermarks are
   polled (``tests.bench.measure``, shared with `make bench`); the relay's CPU (utime + stime) is read at
   the poll that first sees a record and at the one that sees all N, its walsender's (all of it: the
   walsender decodes ahead) at the latter. Then the
   relay stops, the topic is read back and its event ids (header ``id``) counted (fewer than N distinct
   fails the relay and the run), the LogAppendTime of the first and the last record give the rate,
   N / (last - first), and VmHWM the peak RSS. One record is decoded (JSON text, or Avro through the
   registry).
4. results: the markdown table on stdout, everything in JSON (``--output``). Clean-up always runs: every
   JVM and pipeline stopped (their process groups killed if they do not stop), the database and with it the
   slots dropped, the topics deleted, the registry's artifacts of the run deleted, the config files (they hold
   the database password) removed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from cdc.config_loader import load_settings
from cdc.ops import setup as cdc_setup
from tests.bench import db
from tests.bench.debezium import config as dbz
from tests.bench.debezium.connect import ConnectProcess, port_in_use
from tests.bench.debezium.jars import ensure_jars
from tests.bench.load import bulk_fill
from tests.bench.measure import bare_drain, measure_drain
from tests.bench.procs import PipelineProcess
from tests.bench.run import ROOT, kafka_pid, machine_info
from tests.kafka_admin import create_topics, delete_topics

PUBLICATION = "bench_outbox"
RELAYS = ("bare", "cdc", *(f"debezium-{name}" for name in dbz.VARIANTS))
LABELS = {
    "bare": "bare psycopg reader, counts Inserts only",
    "cdc": "`cdc run`",
    **{f"debezium-{v.name}": v.label for v in dbz.VARIANTS.values()},
}


class BenchError(Exception):
    pass


class DebeziumBench:
    def __init__(self, args: argparse.Namespace, environ: dict[str, str]) -> None:
        self.args = args
        admin_dsn = environ.get("CDC_DATABASE_URL")
        bootstrap = environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
        if not admin_dsn or not bootstrap:
            raise BenchError("CDC_DATABASE_URL and CDC_KAFKA_BOOTSTRAP_SERVERS must be set (. .stack/env)")
        self.environ = environ
        self.admin_dsn = admin_dsn
        self.bootstrap = bootstrap
        self.ccompat_url = environ.get("CDC_SCHEMA_REGISTRY_URL")
        self.bench_dsn = db.dsn_for(admin_dsn, args.database)
        self.run_id = time.strftime("%Y%m%d%H%M%S") + secrets.token_hex(2)
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.output: Path = args.output or Path("bench-results") / f"bench-debezium-{self.stamp}.json"
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.relays: list[str] = args.relays
        if (
            any(self.variant(r).avro for r in self.relays if r.startswith("debezium-"))
            and not self.ccompat_url
        ):
            raise BenchError("the Avro variant needs CDC_SCHEMA_REGISTRY_URL (. .stack/env)")
        self.result: dict[str, Any] = {
            "run_id": self.run_id,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.runs: list[dict[str, Any]] = []
        self._admin: Any = None
        self._watch: db.SlotWatch | None = None
        self._kafka_admin = AdminClient({"bootstrap.servers": bootstrap})
        self._topics_created: list[str] = []
        self._processes: list[Any] = []
        self._artifacts: list[str] = []
        self._workdir = Path(tempfile.mkdtemp(prefix="bench-debezium-"))
        os.chmod(self._workdir, 0o700)  # the connector files hold the database password

    # -- names -----------------------------------------------------------------------------------------

    @staticmethod
    def variant(relay: str) -> dbz.Variant:
        return dbz.VARIANTS[relay.removeprefix("debezium-")]

    def slot(self, relay: str) -> str:
        return f"bench_{self.run_id}_{relay.replace('-', '_')}"

    def topic_prefix(self, relay: str) -> str:
        return f"bench.{self.run_id}.{relay}"

    def topic(self, relay: str) -> str:
        return f"{self.topic_prefix(relay)}.order"  # every bench row has aggregate_type 'order'

    def log_path(self, relay: str) -> Path:
        return self.output.with_name(f"{self.output.stem}-{relay}.log")

    # -- phases ----------------------------------------------------------------------------------------

    def run(self) -> None:
        a = self.args
        libs = None
        if any(r.startswith("debezium-") for r in self.relays):
            if port_in_use(a.connect_port):
                raise BenchError(
                    f"port {a.connect_port} for Kafka Connect's REST API is taken: choose another with "
                    "--connect-port or CDC_BENCH_CONNECT_PORT (below 32768)"
                )
            libs = ensure_jars(ROOT / ".stack", ROOT / ".stack" / "logs" / "maven-debezium.log", progress)
        self._admin = db.connect(self.admin_dsn)
        self.result["machine"] = machine_info(self._admin)
        self.result["config"] = {
            "events": a.events,
            "rows_per_txn": a.rows_per_txn,
            "aggregates": a.aggregates,
            "partitions": a.partitions,
            "relays": self.relays,
            "cdc_value_format": a.value_format,
            "database": a.database,
            "connect_rest_port": a.connect_port,
            "connect_jvm_options": list(dbz.JVM_OPTIONS),
        }
        self.prepare()
        progress("fill", f"inserting {a.events:,} outbox rows in transactions of {a.rows_per_txn}")
        fill = bulk_fill(
            self.bench_dsn, events=a.events, rows_per_txn=a.rows_per_txn, aggregates=a.aggregates
        )
        self.result["fill"] = fill
        progress("fill", f"{fill['seconds']:.1f} s, WAL {fill['wal_bytes'] / 2**20:,.0f} MiB")
        for relay in self.relays:
            progress(relay, f"draining {a.events:,} events")
            try:
                run = self.drain_bare() if relay == "bare" else self.drain_relay(relay, libs)
            except (Exception, KeyboardInterrupt) as exc:
                self.runs.append(
                    {"relay": relay, "label": LABELS[relay], "ok": False, "error": short_error(exc)}
                )
                if isinstance(exc, KeyboardInterrupt):
                    raise
                traceback.print_exc()
                progress(relay, f"FAILED: {short_error(exc)}")
                continue
            self.runs.append(run)
            if not run["ok"]:
                progress(relay, f"FAILED: {run.get('error')}")
                continue
            progress(
                relay,
                f"{run['events_per_s']:,} events/s, {run['cpu_us_per_event']} CPU µs/event"
                + (f", peak RSS {run['peak_rss_mb']:.0f} MB" if run.get("peak_rss_mb") else ""),
            )
        failed = [r["relay"] for r in self.runs if not r.get("ok")]
        if failed:
            raise BenchError(f"relays that did not deliver all {a.events:,} events: {', '.join(failed)}")

    def prepare(self) -> None:
        a = self.args
        progress("setup", f"database {a.database}, {len(self.relays)} slots and topics (run {self.run_id})")
        db.recreate_database(self._admin, a.database)
        with db.connect(self.bench_dsn) as conn:
            conn.execute(db.generator_sql())
        # cdc setup makes the table, the publication and the first slot; the others are made here, all
        # before the fill, so that every relay reads the same WAL.
        first_slot = self.slot(self.relays[0])
        settings = load_settings(config_file=None, environ=self.cdc_env(first_slot, "cdc"), overrides={})
        self.result["setup"] = dict(cdc_setup.apply(settings))
        with db.connect(self.bench_dsn) as conn:
            for relay in self.relays[1:]:
                db.create_slot(conn, self.slot(relay))
        self._watch = db.SlotWatch(self.admin_dsn)
        timestamps = {"message.timestamp.type": "LogAppendTime"}
        topics = [
            NewTopic(self.topic(r), num_partitions=a.partitions, replication_factor=1, config=timestamps)
            for r in self.relays
            if r != "bare"
        ]
        if "cdc" in self.relays:
            topics.append(NewTopic(f"{self.topic_prefix('cdc')}.dlq", num_partitions=1, replication_factor=1))
        self._topics_created += [t.topic for t in topics]  # deleted at the end if they exist
        create_topics(self._kafka_admin, topics)

    def cdc_env(self, slot: str, relay: str) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k != "CDC_CONFIG"}
        env.update(
            CDC_DATABASE_URL=self.bench_dsn,
            CDC_SLOT=slot,
            CDC_PUBLICATION=PUBLICATION,
            CDC_TABLE=db.TABLE,
            CDC_TOPIC_TEMPLATE=f"{self.topic_prefix(relay)}.{{aggregate_type}}",
            CDC_DLQ_TOPIC=f"{self.topic_prefix(relay)}.dlq",
            CDC_TOPIC_PARTITIONS=str(self.args.partitions),
            CDC_SCHEMAS_DIR=str(ROOT / "schemas"),
            CDC_VALUE_FORMAT=self.args.value_format,
            CDC_LOG_LEVEL="INFO",
        )
        return env

    def drain_bare(self) -> dict[str, Any]:
        a = self.args
        run = bare_drain(
            self.bench_dsn,
            slot=self.slot("bare"),
            publication=PUBLICATION,
            events=a.events,
            timeout=max(300.0, a.events / 1000),
        )
        return {"relay": "bare", "label": LABELS["bare"], **run}

    def drain_relay(self, relay: str, libs: Path | None) -> dict[str, Any]:
        a = self.args
        watch = self._watch
        assert watch is not None
        slot, topic = self.slot(relay), self.topic(relay)
        log = self.log_path(relay)
        details: dict[str, Any] = {}
        if relay == "cdc":
            proc: Any = PipelineProcess(self.cdc_env(slot, relay), log, ROOT)
        else:
            assert libs is not None
            proc = self.start_connect(relay, slot, libs, log, details)
        self._processes.append(proc)

        def alive() -> None:
            if isinstance(proc, ConnectProcess):
                proc.check()
            elif proc.exited() is not None:
                raise BenchError(f"cdc run exited with code {proc.exited()}:\n{proc.log_tail()}")

        def walsender() -> int | None:
            active, pid, _ = watch.state(slot)
            return pid if active else None

        measured = measure_drain(
            proc,
            kafka_admin=self._kafka_admin,
            bootstrap=self.bootstrap,
            topic=topic,
            partitions=a.partitions,
            events=a.events,
            walsender_pid=walsender,
            alive=alive,
            start_timeout=a.start_timeout,
            drain_timeout=max(300.0, a.events / 500),
            kafka_pid=kafka_pid(),
            registry_url=self.ccompat_url,
        )
        self._processes.remove(proc)
        run: dict[str, Any] = {"relay": relay, "label": LABELS[relay], **measured, "log": str(log), **details}
        described = run["sample_record"]
        if (
            run["ok"]
            and relay.startswith("debezium-")
            and self.variant(relay).avro
            and described.get("value_format") != ("avro confluent")
        ):
            run["ok"] = False
            run["error"] = f"values are not Confluent-framed Avro: {described.get('value_format')}"
        return run

    def start_connect(
        self, relay: str, slot: str, libs: Path, log: Path, details: dict[str, Any]
    ) -> ConnectProcess:
        variant = self.variant(relay)
        database = dbz.database_from_dsn(self.bench_dsn)
        connector = dbz.connector_config(
            variant,
            database=database,
            slot=slot,
            publication=PUBLICATION,
            table=db.TABLE,
            topic_prefix=self.topic_prefix(relay),
        )
        worker = dbz.worker_config(
            variant,
            bootstrap=self.bootstrap,
            offsets_file=str(self._workdir / f"{relay}.offsets"),
            rest_port=self.args.connect_port,
            registry_url=dbz.registry_api(self.ccompat_url) if variant.avro and self.ccompat_url else None,
        )
        worker_file = self._workdir / f"{relay}-worker.properties"
        connector_file = self._workdir / f"{relay}-connector.properties"
        for path, config in ((worker_file, worker), (connector_file, connector)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(dbz.render_properties(config))
        details["worker_config"] = dbz.redacted(worker)
        details["connector_config"] = dbz.redacted(connector)
        if variant.avro:
            self._artifacts.append(f"{self.topic(relay)}-value")
        return ConnectProcess(
            libs=libs,
            worker_file=worker_file,
            connector_file=connector_file,
            log_path=log,
            rest_port=self.args.connect_port,
            name=dbz.connector_name(variant),
        )

    # -- clean-up --------------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        problems: list[str] = []

        def attempt(what: str, action: Any) -> None:
            try:
                action()
            except Exception as exc:  # keep cleaning up; report at the end
                problems.append(f"{what}: {type(exc).__name__}: {exc}")

        for proc in list(self._processes):
            attempt(f"stop pid {proc.pid}", proc.stop)
        if self._watch is not None:
            attempt("close slot watch", self._watch.close)
        if self._admin is not None:
            attempt("drop database and slots", lambda: db.drop_database(self._admin, self.args.database))
            attempt("close admin connection", self._admin.close)
        if self._topics_created:
            attempt("delete topics", lambda: delete_topics(self._kafka_admin, self._topics_created))
        for artifact in self._artifacts:
            attempt(f"delete registry artifact {artifact}", lambda a=artifact: self.delete_artifact(a))
        attempt("remove the config files", lambda: shutil.rmtree(self._workdir))
        return problems

    def delete_artifact(self, artifact: str) -> None:
        """Apicurio's converter registers the value schema as artifact ``<topic>-value`` in the default
        group; a run that failed before it registered leaves none (404)."""
        assert self.ccompat_url
        url = f"{dbz.registry_api(self.ccompat_url)}/groups/default/artifacts/{artifact}"
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


def progress(phase: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {phase}: {message}", file=sys.stderr, flush=True)


def short_error(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted ({exc.args[0] if exc.args else 'SIGINT'})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"

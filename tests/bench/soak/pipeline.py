"""The pipeline under test and its place: the soak's own database, slot and topics (set up and cleaned up),
`cdc run` and the invoice consumer as subprocesses, the consumer group's and the topic's offsets, and the
bounded waits on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.bench.db import connect, drop_database, recreate_database
from tests.bench.measure import Watermarks
from tests.bench.run import machine_info
from tests.bench.soak import PARTITIONS, ROOT, STALL_S, WARM_UP_ROWS, SoakError, progress
from tests.bench.soak.load import GENERATOR_SQL
from tests.bench.soak.sampling import LatencyHistograms, ServerStats
from tests.children import dying_with_parent
from tests.kafka_admin import committed_offsets, create_topics, delete_groups, delete_topics_with_prefix

# The consumer: examples.invoice_service as it is, with its one INFO line per invoice turned off.
CONSUMER_MAIN = (
    "import logging, sys\n"
    "from examples.invoice_service import main\n"
    "logging.getLogger('invoice_service').setLevel(logging.WARNING)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class Child:
    """A subprocess whose stdout and stderr go to ``log_path``; SIGTERM to stop, SIGKILL after a bound."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            dying_with_parent(command),
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
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


class Pipeline:
    """Set-up, start, offsets, waits and clean-up of the soak (a base of Soak: its names, args, children,
    latency, server, loader and result are set by Soak.__init__)."""

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
            dying_with_parent([sys.executable, "-m", "cdc", *args]),
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
        create_topics(self.kafka_admin, topics)

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
        self.group_reader = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.consumer_name, "enable.auto.commit": False}
        )
        self.wait(
            "the warm-up consumed", lambda: (self.consumed() >= WARM_UP_ROWS, self.consumed()), total=120
        )
        progress(f"cdc run (pid {run.pid}) and the consumer (pid {consumer.pid}) are up")

    # -- Kafka offsets -----------------------------------------------------------------------------------

    def published(self) -> int:
        return sum(max(0, v) for v in self.offsets.read().values())

    def consumed(self) -> int:
        """The consumer group's committed offsets, as a consumer of the group that never joins it reads them:
        not the admin API's list_consumer_group_offsets, which crashed this driver (cdc.stream.admin)."""
        partitions = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        answer = committed_offsets(self.group_reader, partitions)
        return sum(max(0, tp.offset) for tp in answer)

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
        if self.group_reader is not None:
            attempt("close the group's reader", self.group_reader.close)
        if self.created_database:
            attempt("cdc teardown", lambda: self.cdc("teardown", "--yes", timeout=120))

            def drop() -> None:
                with connect(self.admin_dsn) as admin:
                    drop_database(admin, self.database)

            attempt("drop the database", drop)

        attempt(
            "delete the topics", lambda: delete_topics_with_prefix(self.kafka_admin, self.topic_prefix + ".")
        )
        attempt("delete the consumer group", lambda: delete_groups(self.kafka_admin, [self.consumer_name]))
        return problems

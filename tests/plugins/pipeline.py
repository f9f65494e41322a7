"""Pipeline fixtures: a private outbox (table, publication, slot, topics) per test, the `cdc run` process as a
subprocess, and a private Kafka broker that a test may stop and start again.

- `outbox`: unique table / publication / pgoutput slot in the module's database (made with
  `cdc.ops.setup.apply`), unique topic template and dead-letter topic; helpers to insert events and read the
  slot's positions.
- `pipeline_process(**env)`: starts `python -m cdc run` with the outbox's environment (plus `env`), logs to a
  file under tmp_path; the log's tail is attached to the report of a failed test; never left running.
- `private_kafka`: a second single-node KRaft broker on free loopback ports (the shared one must never be
  stopped: other tests use it), with `stop()` / `start()` on the same ports and data; killed at teardown.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc.config import Settings
from cdc.config_loader import load_settings
from cdc.errors import parse_lsn
from tests.children import dying_with_parent
from tests.plugins.kafka import (
    Record,
    client_config,
    delete_topics,
    kafka_security_env,
    read_topic,
    with_stack_security,
)
from tests.plugins.proxy import KafkaProxy

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS_DIR = ROOT / "schemas"

_PROCESSES = pytest.StashKey[list[Any]]()


# -- reporting: the tails of the logs of a failed test -------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if report.failed:
        for proc in item.stash.get(_PROCESSES, []):
            report.sections.append((f"{proc.describe()} (last lines of {proc.log_path})", proc.tail()))
    return report


def _register(request: pytest.FixtureRequest, proc: Any) -> None:
    request.node.stash.setdefault(_PROCESSES, []).append(proc)


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def cdc(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`cdc <args>` as a subprocess of this interpreter, from the repository root; output captured."""
    return subprocess.run(
        dying_with_parent([sys.executable, "-m", "cdc", *args]),
        cwd=ROOT,
        env=with_stack_security(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


# -- Kafka helpers that take the bootstrap servers (the shared broker or the private one) --------------------


# A topic created a moment ago is in the metadata before its partitions have a leader.
_NOT_READY = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def topic_size(bootstrap: str, topic: str, timeout: float = 20.0) -> int:
    """How many records `topic` holds (sum over partitions of high - low watermark); 0 when it is missing.
    Waits (up to `timeout`) for partitions that have no leader yet, rather than guessing their size."""
    consumer = Consumer({**client_config(bootstrap), "group.id": f"size-{uuid.uuid4().hex}"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                return 0
            try:
                return sum(
                    high - low
                    for low, high in (
                        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                        for p in metadata.partitions
                    )
                )
            except KafkaException as exc:
                if exc.args[0].code() not in _NOT_READY or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def topic_partitions(bootstrap: str, topic: str) -> int:
    admin = AdminClient(client_config(bootstrap))
    metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
    return 0 if metadata is None or metadata.error is not None else len(metadata.partitions)


# -- the outbox -------------------------------------------------------------------------------------------


def order_placed(order_id: str, amount_cents: Any = 1250) -> dict[str, Any]:
    """A valid OrderPlaced v1 payload."""
    return {
        "order_id": order_id,
        "customer_id": f"c-{order_id}",
        "amount_cents": amount_cents,
        "currency": "EUR",
        "items": [{"sku": "SKU-1", "quantity": 2}],
    }


@dataclass
class Event:
    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    schema_version: int
    payload: Any  # a JSON value, or a str that is already JSON (raw=True)
    headers: dict[str, Any] | None = None
    raw: bool = False

    def payload_json(self) -> str:
        return self.payload if self.raw else json.dumps(self.payload)


@dataclass
class Transaction:
    """One transaction written by the test, with the WAL positions around it."""

    events: list[Event]
    committed: bool
    xid: int = 0  # the 32-bit xid, as pgoutput and the `xid` header carry it
    created_at: datetime | None = None  # now() of the transaction (the rows' created_at)
    lsn_before: int = 0  # pg_current_wal_insert_lsn() before BEGIN
    lsn_after: int = 0  # pg_current_wal_lsn() after COMMIT (>= the commit record's end)
    first: int = 0  # bulk(): the events' `i` (their amount_cents) run from first to first + count - 1
    count: int = 0

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]


@dataclass
class Outbox:
    settings: Settings
    env: dict[str, str]
    dsn: str
    conn: psycopg.Connection[Any]
    topic_prefix: str
    dlq_topic: str
    topics: list[str] = field(default_factory=list)
    transactions: list[Transaction] = field(default_factory=list)

    @property
    def slot(self) -> str:
        return self.settings.slot

    @property
    def table(self) -> str:
        return self.settings.table.name

    def topic(self, aggregate_type: str) -> str:
        name = self.settings.topic_template.format(aggregate_type=aggregate_type, event_type="")
        if name not in self.topics:
            self.topics.append(name)
        return name

    def event(
        self,
        aggregate_id: str,
        payload: Any = None,
        *,
        event_type: str = "OrderPlaced",
        schema_version: int = 1,
        aggregate_type: str = "order",
        headers: dict[str, Any] | None = None,
        raw: bool = False,
    ) -> Event:
        self.topic(aggregate_type)
        event_id = str(uuid.uuid4())
        return Event(
            id=event_id,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            event_type=event_type,
            schema_version=schema_version,
            payload=order_placed(f"o-{event_id[:8]}") if payload is None else payload,
            headers=headers,
            raw=raw,
        )

    def _insert(self, events: list[Event]) -> None:
        self.insert_with(self.conn, events)

    def insert_with(self, conn: psycopg.Connection[Any], events: list[Event]) -> None:
        """Insert ``events`` on ``conn``, in whatever transaction it has open (committed by the caller)."""
        with conn.cursor() as cur:
            cur.executemany(
                psycopg.sql.SQL(
                    "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload,"
                    " headers) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb)"
                ).format(psycopg.sql.Identifier(self.table)),
                [
                    (
                        e.id,
                        e.aggregate_type,
                        e.aggregate_id,
                        e.event_type,
                        e.schema_version,
                        e.payload_json(),
                        None if e.headers is None else json.dumps(e.headers),
                    )
                    for e in events
                ],
            )

    def commit(self, events: list[Event]) -> Transaction:
        """Insert `events` in one transaction and commit it."""
        txn = Transaction(events=list(events), committed=True, lsn_before=self.insert_lsn())
        with self.conn.transaction():
            self._insert(events)
            row = self.conn.execute("SELECT txid_current() % 4294967296, now()").fetchone()
            assert row is not None
            txn.xid, txn.created_at = int(row[0]), row[1]
        txn.lsn_after = self.current_lsn()
        self.transactions.append(txn)
        return txn

    def rollback(self, events: list[Event]) -> Transaction:
        """Insert `events` in one transaction and roll it back."""
        txn = Transaction(events=list(events), committed=False, lsn_before=self.insert_lsn())
        with self.conn.transaction(force_rollback=True):
            self._insert(events)
        txn.lsn_after = self.current_lsn()
        self.transactions.append(txn)
        return txn

    def bulk(
        self,
        count: int,
        *,
        aggregates: int = 50,
        aggregate_type: str = "order",
        per_transaction: int = 0,
        first: int = 0,
    ) -> list[Transaction]:
        """`count` small valid OrderPlaced v1 events inserted with generate_series, in one transaction, or in
        transactions of `per_transaction` events. Event number i (from `first`) has amount_cents i and
        aggregate_id 'agg-<i % aggregates>'. The Transactions carry no Event objects (see `ids()`)."""
        topic = self.topic(aggregate_type)
        assert topic
        size = per_transaction or count
        sql = psycopg.sql.SQL(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
            " SELECT gen_random_uuid(), %(at)s, 'agg-' || (i %% %(aggs)s::int), 'OrderPlaced', 1,"
            " jsonb_build_object('order_id', 'o-' || i, 'customer_id', 'c-' || (i %% 97),"
            " 'amount_cents', i, 'currency', 'EUR',"
            " 'items', jsonb_build_array(jsonb_build_object('sku', 'S' || (i %% 10), 'quantity', 1)))"
            " FROM generate_series(%(lo)s::int, %(hi)s::int) AS i"
        ).format(psycopg.sql.Identifier(self.table))
        out = []
        for start in range(first, first + count, size):
            hi = min(first + count, start + size) - 1
            txn = Transaction(
                events=[], committed=True, lsn_before=self.insert_lsn(), first=start, count=hi - start + 1
            )
            with self.conn.transaction():
                self.conn.execute(sql, {"at": aggregate_type, "aggs": aggregates, "lo": start, "hi": hi})
                row = self.conn.execute("SELECT txid_current() % 4294967296, now()").fetchone()
                assert row is not None
                txn.xid, txn.created_at = int(row[0]), row[1]
            txn.lsn_after = self.current_lsn()
            self.transactions.append(txn)
            out.append(txn)
        return out

    def ids(self) -> set[str]:
        """The ids of every row in the outbox table (what the pipeline must publish)."""
        rows = self.conn.execute(
            psycopg.sql.SQL("SELECT id::text FROM {}").format(psycopg.sql.Identifier(self.table))
        ).fetchall()
        return {r[0] for r in rows}

    def bulk_numbers(self) -> dict[str, int]:
        """id -> the number i of each event written by bulk() (its amount_cents): commit order."""
        rows = self.conn.execute(
            psycopg.sql.SQL("SELECT id::text, (payload->>'amount_cents')::int FROM {}").format(
                psycopg.sql.Identifier(self.table)
            )
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def current_lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return parse_lsn(row[0])

    def insert_lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return parse_lsn(row[0])

    def slot_lsns(self) -> tuple[int, int]:
        """The slot's (confirmed_flush_lsn, restart_lsn)."""
        row = self.conn.execute(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        assert row is not None, f"slot {self.slot} is gone"
        return parse_lsn(row[0]), parse_lsn(row[1])

    def confirmed_lsn(self) -> int:
        return self.slot_lsns()[0]

    def slot_active_pid(self) -> int | None:
        row = self.conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
        ).fetchone()
        return None if row is None else row[0]

    def received_lsn(self) -> int:
        """The WAL position the pipeline reports as received (pg_stat_replication.write_lsn), or 0."""
        row = self.conn.execute(
            "SELECT r.write_lsn::text FROM pg_stat_replication r JOIN pg_replication_slots s"
            " ON s.active_pid = r.pid WHERE s.slot_name = %s",
            (self.slot,),
        ).fetchone()
        return 0 if row is None or row[0] is None else parse_lsn(row[0])


def _env_for(overrides: dict[str, str]) -> dict[str, str]:
    """The subprocess environment: this process's, minus every CDC_* variable, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def own_cluster_env(
    dsn: str, kafka_bootstrap: str, unique_name: Callable[[str], str], **extra: str
) -> dict[str, str]:
    """The environment of a `cdc` subprocess against a cluster of the test's own (not the stack's): unique
    slot, publication and table, plus ``extra`` CDC_* variables."""
    return _env_for(
        {
            "CDC_DATABASE_URL": dsn,
            "CDC_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "CDC_SLOT": unique_name("slot")[:63],
            "CDC_PUBLICATION": unique_name("pub")[:63],
            "CDC_TABLE": "public." + unique_name("outbox")[:50],
            "CDC_SCHEMAS_DIR": str(SCHEMAS_DIR),
            **extra,
        }
    )


@pytest.fixture
def outbox(
    pg_database: str,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    unique_name: Callable[[str], str],
) -> Iterator[Outbox]:
    prefix = unique_name("cdc")
    cdc_env = {
        "CDC_DATABASE_URL": pg_database,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "CDC_SLOT": unique_name("slot")[:63],
        "CDC_PUBLICATION": unique_name("pub")[:63],
        "CDC_TABLE": "public." + unique_name("outbox")[:63],
        "CDC_TOPIC_TEMPLATE": prefix + ".{aggregate_type}",
        "CDC_DLQ_TOPIC": unique_name("dlq"),
        "CDC_SCHEMAS_DIR": str(SCHEMAS_DIR),
        "CDC_TOPIC_PARTITIONS": "3",
        "CDC_STATUS_INTERVAL": "1",
        "CDC_SHUTDOWN_TIMEOUT": "30",
        "CDC_DELIVERY_TIMEOUT": "60",
        "CDC_STARTUP_TIMEOUT": "10",
        "CDC_BACKOFF_MAX": "2",
        "CDC_LOG_LEVEL": "INFO",
    }
    overrides = {
        "database_url": pg_database,
        "kafka.bootstrap_servers": kafka_bootstrap,
        "slot": cdc_env["CDC_SLOT"],
        "publication": cdc_env["CDC_PUBLICATION"],
        "table": cdc_env["CDC_TABLE"],
        "topic_template": cdc_env["CDC_TOPIC_TEMPLATE"],
        "dlq_topic": cdc_env["CDC_DLQ_TOPIC"],
        "schemas_dir": str(SCHEMAS_DIR),
        "topic_partitions": 3,
        "status_interval": 1.0,
    }
    settings = load_settings(
        config_file=None, environ=kafka_security_env(kafka_bootstrap), overrides=overrides
    )
    from cdc.ops import setup as cdc_setup

    cdc_setup.apply(settings)
    conn = psycopg.connect(pg_database, autocommit=True)
    box = Outbox(
        settings=settings,
        env=_env_for(cdc_env),
        dsn=pg_database,
        conn=conn,
        topic_prefix=prefix,
        dlq_topic=settings.dlq_topic,
        topics=[settings.dlq_topic],
    )
    try:
        yield box
    finally:
        try:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE slot_name = %s AND active_pid IS NOT NULL",
                (settings.slot,),
            )
            # A terminated walsender releases its slot asynchronously.
            wait_until(lambda: box.slot_active_pid() is None, 10, "the slot to be released")
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (settings.slot,),
            )
            conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(psycopg.sql.Identifier(box.table)))
            conn.execute(
                "DO $$ BEGIN IF to_regclass('public.cdc_checkpoint') IS NOT NULL THEN"
                " DELETE FROM public.cdc_checkpoint WHERE slot = " + psycopg.sql.quote(settings.slot) + ";"
                " END IF; END $$"
            )
        finally:
            conn.close()
            delete_topics(kafka_admin, box.topics)


# -- the pipeline process ------------------------------------------------------------------------------------


class ModuleProcess:
    """`python -m <module> <args>` as a subprocess of this interpreter, from the repository root, its output
    in `log_path`; `what` names it in failure messages."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, what: str) -> None:
        env = with_stack_security(env)
        self.env = env
        self.log_path = log_path
        self.what = what
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in cleanup()
        self.proc = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", *argv]),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def describe(self) -> str:
        rc = self.proc.poll()
        return f"{self.what} pid {self.pid} ({'running' if rc is None else f'exit code {rc}'})"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first match of the regex `pattern` in the log; fails when the process exits before or after
        `timeout` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log())
            if match:
                return match
            if not self.alive():
                raise AssertionError(
                    f"the {self.what} exited with code {self.proc.returncode} before logging {pattern!r}:\n"
                    + self.tail()
                )
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"the {self.what} did not log {pattern!r} within {timeout:g} s:\n" + self.tail()
                )
            time.sleep(0.1)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the {self.what} did not exit within {timeout:g} s:\n" + self.tail()
            ) from None

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for the exit, return the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        """SIGKILL (kill -9), wait, return the exit code (-9)."""
        if self.alive():
            self.proc.kill()
        return self.proc.wait(30)

    def cleanup(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()


class PipelineProcess(ModuleProcess):
    """One `python -m cdc run` subprocess."""

    def __init__(self, env: dict[str, str], log_path: Path, args: tuple[str, ...] = ()) -> None:
        super().__init__(["cdc", "run", *args], env, log_path, "pipeline")

    def wait_streaming(self, timeout: float = 30.0) -> None:
        self.wait_for_log(r"streaming from slot", timeout)

    def status(self, key: str) -> int:
        """A value in kB from /proc/<pid>/status (VmHWM, VmRSS...)."""
        text = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        assert match, f"{key} not in /proc/{self.pid}/status"
        return int(match.group(1))


@pytest.fixture
def pipeline_process(
    outbox: Outbox, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., PipelineProcess]]:
    """`pipeline_process(*args, **env)` starts `python -m cdc run *args` with `outbox.env` updated by `env`
    (CDC_* names); every process it started is killed at teardown."""
    started: list[PipelineProcess] = []

    def start(*args: str, **env: str) -> PipelineProcess:
        log_path = tmp_path / f"pipeline-{len(started) + 1}.log"
        proc = PipelineProcess({**outbox.env, **env}, log_path, args)
        started.append(proc)
        _register(request, proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.cleanup()


# -- a private Kafka broker ----------------------------------------------------------------------------------


def format_broker(
    java: list[str], home: Path, port: int, controller_port: int, advertised_port: int | None = None
) -> Path:
    """A single-node KRaft broker's server.properties in ``home`` (the stack's template on these ports, data
    in ``home/data``; clients told to connect to ``advertised_port``, a proxy's, when given), its storage
    formatted; returns the properties file."""
    data = home / "data"
    data.mkdir(parents=True, exist_ok=True)
    properties = home / "server.properties"
    template = (ROOT / "stack" / "kafka" / "server.properties.in").read_text()
    if advertised_port is not None:
        # Clients are told the proxy's port; the broker's own connections (to itself: transaction markers)
        # use a listener of their own, so that freezing the proxy freezes clients only. Later keys win.
        internal = free_port()
        template += (
            f"listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CONTROLLER_PORT@,"
            f"INTERNAL://127.0.0.1:{internal}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port},"
            f"CONTROLLER://127.0.0.1:@CONTROLLER_PORT@,INTERNAL://127.0.0.1:{internal}\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT\n"
            "inter.broker.listener.name=INTERNAL\n"
        )
    properties.write_text(
        template.replace("@PORT@", str(port))
        .replace("@CONTROLLER_PORT@", str(controller_port))
        .replace("@DATA_DIR@", str(data))
    )
    with open(home / "format.log", "wb") as out:
        subprocess.run(
            dying_with_parent(
                [
                    *java,
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    _cluster_id(),
                    "-c",
                    str(properties),
                ]
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=True,
            timeout=120,
        )
    return properties


def _cluster_id() -> str:
    """A KRaft cluster id like `kafka-storage random-uuid` makes: 16 random bytes, base64url, no padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class PrivateKafka:
    """A single-node KRaft broker of the test's own."""

    def __init__(
        self, libs: str, home: Path, *, port: int | None = None, advertised_port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{advertised_port or self.port}"
        self.home = home
        self.data = home / "data"
        self.log_path = home / "kafka.log"
        self.java = [
            "java",
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={ROOT / 'stack' / 'kafka' / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.properties = format_broker(self.java, home, self.port, self.controller_port, advertised_port)

    def describe(self) -> str:
        state = "running" if self.proc is not None and self.proc.poll() is None else "stopped"
        return f"private Kafka broker {self.bootstrap} ({state})"

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def start(self, timeout: float = 90.0) -> None:
        """Start the broker and wait until it serves (a client's metadata request answered)."""
        mark = self.launch()
        self.wait_started(mark, timeout)

    def launch(self) -> str:
        """Start the broker and return at once: what a client meets next is a broker that is starting."""
        assert self.proc is None or self.proc.poll() is not None, "the private broker is already running"
        self.starts += 1
        mark = f"=== start {self.starts} ===\n"
        with open(self.log_path, "a") as log:
            log.write(mark)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed right after
        try:
            self.proc = subprocess.Popen(
                dying_with_parent([*self.java, "kafka.Kafka", str(self.properties)]),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log_file.close()
        return mark

    def wait_started(self, mark: str, timeout: float = 90.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the private Kafka broker exited during start-up:\n{self.tail()}")
            text = self.log_path.read_text(errors="replace")
            if "Kafka Server started" in text.rsplit(mark, 1)[-1] and port_open(self.port):
                break
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"the private Kafka broker did not start in {timeout:g} s:\n{self.tail()}"
                )
            time.sleep(0.2)
        admin = AdminClient(client_config(self.bootstrap))
        admin.list_topics(timeout=30)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait: a clean shutdown, the data stays for start()."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
            raise AssertionError(f"the private Kafka broker ignored SIGTERM for {timeout:g} s") from None

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def consume(self, topic: str, n: int, timeout: float = 30.0) -> list[Record]:
        return read_topic(self.bootstrap, topic, n, timeout)

    def topic_size(self, topic: str) -> int:
        return topic_size(self.bootstrap, topic)


def _kafka_libs() -> str:
    libs = os.environ.get("CDC_STACK_KAFKA_LIBS")
    if not libs or not Path(libs).is_dir():
        from tests.plugins.services import service_missing

        service_missing("CDC_STACK_KAFKA_LIBS (the Kafka broker's jars, from `make stack-up`) is not set")
        raise AssertionError("unreachable")
    return libs


@contextlib.contextmanager
def _running(broker: PrivateKafka, request: pytest.FixtureRequest) -> Iterator[PrivateKafka]:
    _register(request, broker)
    try:
        broker.start()
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def private_kafka(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PrivateKafka]:
    with _running(PrivateKafka(_kafka_libs(), tmp_path / "private-kafka"), request) as broker:
        yield broker


@pytest.fixture
def proxied_kafka(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[PrivateKafka, KafkaProxy]]:
    """A private broker that clients reach only through a :class:`KafkaProxy` (it advertises the proxy)."""
    port = free_port()
    proxy = KafkaProxy(("127.0.0.1", port))
    proxy.start()
    try:
        home = tmp_path / "private-kafka"
        broker = PrivateKafka(_kafka_libs(), home, port=port, advertised_port=proxy.port)
        with _running(broker, request):
            yield broker, proxy
    finally:
        proxy.stop()

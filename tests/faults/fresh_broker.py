"""Reproduction, without the pipeline: keyed records produced by an idempotent producer into a topic created a
moment earlier on a freshly started Kafka broker. Does any record whose delivery report said success go
missing from the partition?

    cd /work/main && .venv/bin/python -m tests.faults.fresh_broker --runs 100 [--through-sink]

Each run formats a new KRaft storage in a temp dir under /tmp, starts a broker from the stack's own
server.properties template (ports 31092/31093 by default: never the stack's), creates a producer (the config
of cdc.stream.sink.producer_config) and an AdminClient as soon as the broker answers, creates a new topic (3
partitions, RF 1), produces a few hundred keyed records straight after the create returns, flushes, reads
every partition back from offset 0 with an assigned consumer, and checks that every acknowledged record sits
at the partition and offset its delivery report gave. Then it kills the broker and removes the temp dir.

The timing varies from run to run (``--timing`` picks one): the client starts when the broker's port opens
(``port``) or after it logged "Kafka Server started" (``started``); the producer is created before the topic
(``producer-first``, as KafkaSink does) or after the create returned (``topic-first``).

With ``--through-sink`` the records go through the project's cdc.stream.sink.KafkaSink (Settings from
cdc.config.load_settings; check_broker, ensure_topic, produce with a delivery callback, flush).

When a run loses acknowledged records, its evidence (broker log, librdkafka log, DumpLogSegments of every
partition, the delivery reports) is kept under --evidence-dir. Exit status: 0 if nothing acknowledged went
missing, 1 otherwise, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.children import dying_with_parent
from tests.plugins.pipeline import format_broker

ROOT = Path(__file__).resolve().parents[2]
LIBS = Path(os.environ.get("CDC_STACK_KAFKA_LIBS", ROOT / ".stack" / "kafka" / "libs"))
LOG4J = ROOT / "stack" / "kafka" / "log4j2.properties"
FORBIDDEN_PORTS = {25432, 29092, 29093, 28081}  # the project's stack
PID_WARNING = "Failed to acquire idempotence PID"
TIMINGS = (
    "port/producer-first",
    "port/topic-first",
    "started/producer-first",
    "started/topic-first",
    "port/producer-warm",  # the producer gets --warm-s to acquire its PID before the topic is created
    "started/producer-warm",
)
DEBUG = "msg,eos,protocol,topic,broker"
LIGHT_DEBUG = "msg,eos"  # default: enough to see produce errors and implicit acks, little output
PRODUCE_ERROR = "encountered error"  # librdkafka MSGSET debug line of a failed ProduceRequest partition
IMPLICIT_ACK = "implicitly acked"  # librdkafka IMPLICITACK: messages acked by a later batch's success


# --------------------------------------------------------------------------------------------------- broker


def java_cmd(heap: str) -> list[str]:
    """The stack's kafka_java_args (stack/stack.sh)."""
    return [
        "java",
        "-Xms256m",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J}",
        "-cp",
        f"{LIBS}/*",
    ]


def dump_batches(segment: bytes) -> str:
    """The v2 record batch headers of a log segment (they are not compressed): offsets, producer id and
    epoch, and sequence numbers, which is what tells which batch the broker took as the partition's first."""
    lines, pos = [], 0
    while pos + 61 <= len(segment):
        base_offset, length, _leader_epoch, magic = struct.unpack_from(">qiib", segment, pos)
        if length <= 0:
            break
        attrs, last_delta, _ts0, _ts1, pid, epoch, base_seq, count = struct.unpack_from(
            ">hiqqqhii", segment, pos + 21
        )
        codec = ("none", "gzip", "snappy", "lz4", "zstd")[attrs & 7] if attrs & 7 < 5 else str(attrs & 7)
        lines.append(
            f"baseOffset {base_offset} lastOffset {base_offset + last_delta} count {count} magic {magic} "
            f"producerId {pid} producerEpoch {epoch} baseSequence {base_seq} "
            f"lastSequence {base_seq + last_delta} "
            f"compression {codec} size {length + 12}"
        )
        pos += 12 + length
    return "\n".join(lines) + "\n"


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Broker:
    def __init__(self, port: int, controller_port: int, heap: str) -> None:
        self.port, self.controller_port = port, controller_port
        self.bootstrap = f"127.0.0.1:{port}"
        self.java = java_cmd(heap)
        self.home = Path(tempfile.mkdtemp(prefix="fresh-broker-", dir="/tmp"))
        self.data = self.home / "data"
        self.log_path = self.home / "kafka.log"
        self.props = self.home / "server.properties"
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_spawn = self.t_port = self.t_started = 0.0

    def format(self) -> None:
        self.props = format_broker(self.java, self.home, self.port, self.controller_port)

    def spawn(self) -> None:
        for p in (self.port, self.controller_port):
            if port_open(p):
                raise RuntimeError(f"port {p} is already taken: is an earlier broker still running?")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                dying_with_parent([*self.java, "kafka.Kafka", str(self.props)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.t_spawn = time.monotonic()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, until: str, timeout: float = 90.0) -> None:
        """until='port': the broker's port accepts connections; 'started': also "Kafka Server started"."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited during start-up:\n{self.log_text()[-3000:]}")
            if not self.t_port and port_open(self.port):
                self.t_port = time.monotonic()
            if not self.t_started and "Kafka Server started" in self.log_text():
                self.t_started = time.monotonic()
            if self.t_port and (until == "port" or self.t_started):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not come up in {timeout:g} s:\n{self.log_text()[-3000:]}")
            time.sleep(0.01 if until == "port" else 0.05)

    def note_started(self) -> None:
        if not self.t_started and "Kafka Server started" in self.log_text():
            self.t_started = time.monotonic()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 15
        while (port_open(self.port) or port_open(self.controller_port)) and time.monotonic() < deadline:
            time.sleep(0.1)

    def dump_segments(self, topic: str, partitions: int, out: Path) -> None:
        """Copy each partition's segments into ``out`` and dump them: with DumpLogSegments when the jars have
        it (kafka-tools, not part of the stack's broker jars), and always with dump_batches below."""
        for p in range(partitions):
            for seg in sorted((self.data / f"{topic}-{p}").glob("*.log")):
                name = f"{topic}-{p}-{seg.stem}"
                shutil.copy(seg, out / f"{name}.log")
                (out / f"batches-{name}.txt").write_text(dump_batches(seg.read_bytes()))
                for main in ("org.apache.kafka.tools.DumpLogSegments", "kafka.tools.DumpLogSegments"):
                    done = subprocess.run(
                        dying_with_parent(
                            [*self.java, main, "--files", str(seg), "--print-data-log", "--deep-iteration"]
                        ),
                        capture_output=True,
                        stdin=subprocess.DEVNULL,
                        timeout=120,
                    )
                    if done.returncode == 0:
                        (out / f"dump-{name}.txt").write_bytes(done.stdout)
                        break

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


# --------------------------------------------------------------------------------------------------- clients


class LogCapture(logging.Handler):
    """librdkafka's log lines (the `logger` config key), kept in memory and optionally written to a file."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._lines_lock = threading.Lock()
        self.t0 = time.monotonic()
        self.file = open(path, "w", buffering=1) if path else None  # noqa: SIM115

    def emit(self, record: logging.LogRecord) -> None:
        line = f"{time.monotonic() - self.t0:9.3f} {record.levelname:7s} {record.getMessage()}"
        with self._lines_lock:
            self.lines.append(line)
            if self.file:
                self.file.write(line + "\n")

    def mark(self, text: str) -> None:
        self.emit(logging.LogRecord("mark", logging.INFO, "", 0, f"=== {text}", None, None))

    def has(self, needle: str) -> bool:
        with self._lines_lock:
            return any(needle in line for line in self.lines)

    def count(self, needle: str) -> int:
        with self._lines_lock:
            return sum(needle in line for line in self.lines)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        super().close()


def make_logger(name: str, capture: LogCapture) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [capture]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger


def plain_producer_config(bootstrap: str) -> dict[str, Any]:
    """cdc.stream.sink.producer_config with the default Settings (max_in_flight 20000, delivery_timeout
    120 s, backoff 0.5 s .. backoff_max)."""
    from cdc.config import KafkaSettings, Settings
    from cdc.stream.kafka_config import producer_config

    return producer_config(Settings(database_url="unused", kafka=KafkaSettings(bootstrap_servers=bootstrap)))


@dataclass
class Report:
    key: str
    seq: int
    err: str | None = None
    partition: int = -1
    offset: int = -1
    at: float = 0.0


@dataclass
class RunResult:
    run: int
    timing: str
    sink: bool
    produced: int = 0
    acked: int = 0
    failed: int = 0
    undelivered: int = 0
    found: int = 0
    missing: list[Report] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    pid_warning: bool = False
    produce_errors: int = 0
    implicit_acks: int = 0
    note: str = ""
    t_port: float = 0.0
    t_started: float = 0.0
    t_topic: float = 0.0
    error: str = ""


def read_back(
    bootstrap: str, topic: str, partitions: int, timeout: float
) -> dict[tuple[int, int], tuple[str, int]]:
    """(partition, offset) -> (key, seq) of every record in the topic, read from offset 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fresh-broker-check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "logger": make_logger("fresh_broker.consumer", LogCapture(None)),
        }
    )
    found: dict[tuple[int, int], tuple[str, int]] = {}
    try:
        high = {}
        for p in range(partitions):
            _, high[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        done = {p for p in range(partitions) if high[p] == 0}
        deadline = time.monotonic() + timeout
        while len(done) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= high[msg.partition()]:
                        done.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            value = json.loads(msg.value())
            found[(msg.partition(), msg.offset())] = (value["key"], value["seq"])
            if msg.offset() + 1 >= high[msg.partition()]:
                done.add(msg.partition())
        if len(done) < partitions:
            raise RuntimeError(f"read-back timed out: partitions done {sorted(done)}, high {high}")
    finally:
        consumer.close()
    return found


# --------------------------------------------------------------------------------------------------- one run


def warm_up(poll: Any, seconds: float) -> None:
    """Serve the client for ``seconds`` (it acquires its idempotence PID meanwhile)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        poll(0.05)


def one_run(n: int, timing: str, args: argparse.Namespace) -> RunResult:
    wait_for, order = timing.split("/")
    warm = args.warm_s if order == "producer-warm" else 0.0
    res = RunResult(run=n, timing=timing, sink=args.through_sink)
    broker = Broker(args.port, args.controller_port, args.heap)
    client_log = broker.home / "librdkafka.log"
    capture = LogCapture(client_log)
    topic = f"fresh.t{n}.{uuid.uuid4().hex[:6]}"
    reports: dict[tuple[str, int], Report] = {}
    keep = False
    try:
        broker.format()
        broker.spawn()
        broker.wait(wait_for)
        t0 = time.monotonic()
        capture.mark(f"broker answers ({wait_for}) {t0 - broker.t_spawn:.2f} s after spawn")

        def on_delivery(key: str, seq: int):  # noqa: ANN202
            def done(err: KafkaError | None, msg: Any) -> None:
                r = reports[(key, seq)]
                r.err = None if err is None else err.str()
                r.partition, r.offset, r.at = msg.partition(), msg.offset(), time.monotonic() - t0

            return done

        def value_of(key: str, seq: int) -> bytes:
            return json.dumps({"key": key, "seq": seq, "pad": "x" * args.pad}).encode()

        keys = [f"agg-{i}" for i in range(args.keys)]
        plan = [(keys[i % len(keys)], i // len(keys)) for i in range(args.records)]

        if args.through_sink:
            from cdc.config_loader import load_settings
            from cdc.stream.sink import KafkaSink

            overrides: dict[str, Any] = {"topic_partitions": args.partitions}
            extra = dict(args.producer_conf)
            if args.debug_level:
                extra["debug"] = args.debug_level
            if extra:
                overrides["kafka"] = extra
            settings = load_settings(
                config_file=None,
                environ={
                    "CDC_DATABASE_URL": "postgresql://unused@127.0.0.1:1/unused",
                    "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                },
                overrides=overrides,
            )
            make_logger("cdc.kafka", capture)
            make_logger("cdc.sink", capture)
            sink = KafkaSink(settings)
            sink.check_broker(settings.startup_timeout)
            warm_up(sink.poll, warm)
            sink.ensure_topic(topic)
            res.t_topic = time.monotonic() - t0
            capture.mark(f"topic {topic} created {res.t_topic:.3f} s")
            for key, seq in plan:
                reports[(key, seq)] = Report(key, seq)
                sink.produce(
                    topic,
                    key.encode(),
                    value_of(key, seq),
                    [("seq", str(seq))],
                    int(time.time() * 1000),
                    on_delivery(key, seq),
                    lambda: None,
                )
                res.produced += 1
                sink.poll(0)
                if args.pace_ms:
                    time.sleep(args.pace_ms / 1000)
            left = sink.flush(args.flush_timeout)
            poll = sink.poll
        else:
            conf = plain_producer_config(broker.bootstrap)
            conf["logger"] = make_logger("fresh_broker.producer", capture)
            if args.debug_level:
                conf["debug"] = args.debug_level
            conf.update(dict(args.producer_conf))
            admin = AdminClient(
                {"bootstrap.servers": broker.bootstrap, "logger": make_logger("fresh_broker.admin", capture)}
            )
            producer = None if order == "topic-first" else Producer(conf)
            if producer is not None:
                warm_up(producer.poll, warm)
            futures = admin.create_topics(
                [NewTopic(topic, num_partitions=args.partitions, replication_factor=1)], operation_timeout=30
            )
            futures[topic].result(timeout=60)
            res.t_topic = time.monotonic() - t0
            capture.mark(f"topic {topic} created {res.t_topic:.3f} s")
            if producer is None:
                producer = Producer(conf)
            for key, seq in plan:
                reports[(key, seq)] = Report(key, seq)
                while True:
                    try:
                        producer.produce(
                            topic, value_of(key, seq), key.encode(), on_delivery=on_delivery(key, seq)
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                res.produced += 1
                producer.poll(0)
                if args.pace_ms:
                    time.sleep(args.pace_ms / 1000)
            left = producer.flush(args.flush_timeout)
            poll = producer.poll
        capture.mark(f"flushed, {left} left")
        poll(0.2)  # serve the last log lines
        res.undelivered = left
        broker.note_started()
        res.t_port = broker.t_port - broker.t_spawn if broker.t_port else 0.0
        res.t_started = broker.t_started - broker.t_spawn if broker.t_started else 0.0
        res.pid_warning = capture.has(PID_WARNING)
        res.produce_errors = capture.count(PRODUCE_ERROR)
        res.implicit_acks = capture.count(IMPLICIT_ACK)

        found = read_back(broker.bootstrap, topic, args.partitions, args.read_timeout)
        res.found = len(found)
        where = {v: k for k, v in found.items()}
        for r in reports.values():
            if r.err is not None:
                res.failed += 1
                continue
            if r.at == 0.0:
                continue  # no report at all: counted in undelivered
            res.acked += 1
            at = where.get((r.key, r.seq))
            if at is None:
                res.missing.append(r)
            elif at != (r.partition, r.offset):
                res.misplaced.append(
                    f"{r.key}#{r.seq} reported {r.partition}@{r.offset} found {at[0]}@{at[1]}"
                )
        if res.missing or res.misplaced:
            keep = True
            evidence = Path(args.evidence_dir) / f"run-{n:03d}-{'sink' if args.through_sink else 'plain'}"
            evidence.mkdir(parents=True, exist_ok=True)
            capture.close()
            shutil.copy(client_log, evidence / "librdkafka.log")
            shutil.copy(broker.log_path, evidence / "kafka.log")
            with open(evidence / "reports.json", "w") as f:
                json.dump([r.__dict__ for r in reports.values()], f, indent=0)
            with open(evidence / "found.json", "w") as f:
                json.dump(sorted([[p, o, k, s] for (p, o), (k, s) in found.items()]), f)
            broker.kill()
            broker.dump_segments(topic, args.partitions, evidence)
            res.note = f"evidence in {evidence}"
    except Exception as exc:  # noqa: BLE001 - a run's failure is reported, then the next run goes on
        res.error = f"{type(exc).__name__}: {exc}"[:500]
        res.pid_warning = capture.has(PID_WARNING)
        if args.keep_failed:
            keep = True
            res.note = f"kept {broker.home}"
    finally:
        capture.close()
        broker.kill()
        if args.keep:
            res.note = (res.note + "; " if res.note else "") + f"kept {broker.home}"
        elif not (keep and args.keep_failed):
            broker.remove()
    return res


def summary(res: RunResult) -> str:
    missing = ", ".join(f"{r.key}#{r.seq}->p{r.partition}@{r.offset}" for r in res.missing[:12])
    more = f" (+{len(res.missing) - 12})" if len(res.missing) > 12 else ""
    line = (
        f"run {res.run:3d} {'sink ' if res.sink else 'plain'} {res.timing:22s} port {res.t_port:5.2f}s "
        f"started {res.t_started:5.2f}s topic +{res.t_topic:5.2f}s produced {res.produced} acked {res.acked} "
        f"failed {res.failed} undelivered {res.undelivered} found {res.found} "
        f"missing {len(res.missing)} [{missing}{more}] misplaced {len(res.misplaced)} "
        f"pid-warning {'yes' if res.pid_warning else 'no'} produce-errors {res.produce_errors} "
        f"implicit-acks {res.implicit_acks}"
    )
    if res.misplaced:
        line += f" misplaced: {res.misplaced[:5]}"
    if res.error:
        line += f" ERROR {res.error}"
    if res.note:
        line += f" ({res.note})"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.faults.fresh_broker", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--through-sink", action="store_true", help="produce through cdc.stream.sink.KafkaSink")
    ap.add_argument(
        "--timing",
        choices=(*TIMINGS, "cycle"),
        default="cycle",
        help="when the client starts and in what order (default: cycle through all of them)",
    )
    ap.add_argument(
        "--warm-s", type=float, default=2.5, help="head start of the producer in the producer-warm timings"
    )
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--keys", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--pad", type=int, default=100, help="bytes of padding in each value")
    ap.add_argument("--pace-ms", type=float, default=1.0, help="sleep between two produce() calls")
    ap.add_argument("--port", type=int, default=31092)
    ap.add_argument("--controller-port", type=int, default=31093)
    ap.add_argument("--heap", default="1g")
    ap.add_argument(
        "--producer-conf",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=lambda kv: tuple(kv.split("=", 1)),
        help="an extra librdkafka producer setting (e.g. max.in.flight.requests.per.connection=1); "
        "through the sink it goes in as kafka.<key>",
    )
    ap.add_argument("--flush-timeout", type=float, default=60.0)
    ap.add_argument("--read-timeout", type=float, default=30.0)
    ap.add_argument(
        "--debug",
        dest="debug_level",
        action="store_const",
        const=DEBUG,
        default=LIGHT_DEBUG,
        help=f"librdkafka debug={DEBUG} into the client log (default: {LIGHT_DEBUG})",
    )
    ap.add_argument(
        "--no-debug",
        dest="debug_level",
        action="store_const",
        const="",
        help="no librdkafka debug logging at all",
    )
    ap.add_argument("--evidence-dir", default="/tmp/fresh-broker-evidence")
    ap.add_argument("--keep-failed", action="store_true", help="keep the temp dir of a run that errored")
    ap.add_argument("--keep", action="store_true", help="keep every run's temp dir (broker and client logs)")
    ap.add_argument("--stop-on-loss", action="store_true")
    args = ap.parse_args(argv)
    if {args.port, args.controller_port} & FORBIDDEN_PORTS or args.port == args.controller_port:
        ap.error(f"ports must differ and avoid the stack's {sorted(FORBIDDEN_PORTS)}")
    if not any(LIBS.glob("kafka_2.13-*.jar")):
        print(f"no Kafka jars in {LIBS} (run make stack-up once)", file=sys.stderr)
        return 2

    totals: dict[str, list[int]] = {}
    lossy_runs, errors = 0, 0
    for n in range(1, args.runs + 1):
        timing = TIMINGS[(n - 1) % len(TIMINGS)] if args.timing == "cycle" else args.timing
        res = one_run(n, timing, args)
        print(summary(res), flush=True)
        t = totals.setdefault(timing, [0, 0, 0, 0, 0, 0, 0, 0])
        t[0] += 1
        t[1] += res.acked
        t[2] += len(res.missing) + len(res.misplaced)
        t[3] += 1 if res.pid_warning else 0
        t[4] += 1 if res.error else 0
        t[5] += 1 if (res.missing or res.misplaced) else 0
        t[6] += 1 if res.produce_errors else 0
        t[7] += 1 if res.implicit_acks else 0
        lossy_runs += 1 if (res.missing or res.misplaced) else 0
        errors += 1 if res.error else 0
        if (res.missing or res.misplaced) and args.stop_on_loss:
            break
    mode = "sink" if args.through_sink else "plain"
    for timing, (runs, acked, missing, pidw, errs, lossy, perr, impl) in sorted(totals.items()):
        print(
            f"total {mode} {timing:22s} runs {runs} acked {acked} missing {missing} lossy-runs {lossy} "
            f"pid-warning-runs {pidw} produce-error-runs {perr} implicit-ack-runs {impl} errored-runs {errs}"
        )
    runs = sum(t[0] for t in totals.values())
    acked = sum(t[1] for t in totals.values())
    missing = sum(t[2] for t in totals.values())
    print(
        f"TOTAL {mode} runs {runs} acked {acked} missing {missing} lossy-runs {lossy_runs} "
        f"errored-runs {errors}"
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

"""Measuring one drain of a pre-filled slot from the outside, the same way for every relay (`make bench` and
`make bench-debezium`): the topic's watermarks polled while it runs (first arrival, all N arrived, CPU of
the relay and of its walsender at those two moments), then the broker's LogAppendTime of the first and the
last record of each partition (the rate), and the relay's VmHWM (peak RSS). The bare reader, which writes
no topic, is measured the same way from its own counts (:func:`bare_drain`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from cdc.stream.admin import ask
from tests.bench.procs import MachineCpu, cpu_seconds, thread_cpu_seconds, vmhwm_mb
from tests.bench.table import figures
from tests.children import dying_with_parent

ROOT = Path(__file__).resolve().parents[2]
LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME


def total_cpu(pids: Sequence[int]) -> float | None:
    """utime + stime of all ``pids`` (seconds), or None when one of them is gone."""
    total = 0.0
    for pid in pids:
        value = cpu_seconds(pid)
        if value is None:
            return None
        total += value
    return total


class Watermarks:
    """The high watermarks of a topic's partitions, all in one ListOffsets request."""

    def __init__(self, admin: AdminClient, topic: str, partitions: int) -> None:
        self.topic = topic
        self._admin = admin
        self._request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}

    def read(self, retry_for: float = 30) -> dict[int, int]:
        """Asks again while a new topic's partitions get their leader (not leader, unknown partition), or a
        broker just started settles, for up to ``retry_for`` s (cdc.stream.admin)."""

        def offsets(left: float) -> dict[int, int]:
            futures = self._admin.list_offsets(self._request, request_timeout=min(left, 10))
            return {tp.partition: future.result(timeout=15).offset for tp, future in futures.items()}

        return ask(offsets, what=f"end offsets of {self.topic}", bound=retry_for, topic_expected=True)


@dataclass
class Moment:
    """What the poll loop saw at one instant."""

    monotonic: float
    records: int
    relay_cpu: float | None
    walsender_cpu: float | None
    relay_threads: dict[str, float] = field(default_factory=dict)  # the first relay's CPU by thread name


@dataclass
class Drain:
    """The outcome of :func:`watch_drain`."""

    first: Moment
    done: Moment
    watermarks_done: dict[int, int]
    walsender_pid: int | None
    polls: int


class DrainFailed(Exception):
    pass


def _moment(now: float, records: int, pids: Sequence[int], wal_pid: int | None) -> Moment:
    threads = thread_cpu_seconds(pids[0] if pids else None)
    return Moment(now, records, total_cpu(pids), cpu_seconds(wal_pid), threads)


def watch_drain(
    *,
    watermarks: Watermarks,
    expected: int,
    relay_pids: Callable[[], Sequence[int]],
    walsender_pid: Callable[[], int | None],
    alive: Callable[[], None],
    start_timeout: float,
    drain_timeout: float,
    interval: float = 0.05,
    delivered: Callable[[], bool] | None = None,
) -> Drain:
    """Poll the topic until it holds ``expected`` records. ``alive()`` raises when the relay died or failed;
    ``walsender_pid()`` gives the slot's active_pid (None while the relay has not connected). The CPU
    figures are read at the poll that first saw a record and at the one that saw them all.

    With Kafka transactions the offsets count the commit markers too, so ``expected`` offsets come before
    the last record: ``delivered()`` then says when all were (the relay confirmed the end of the fill)."""
    started = time.monotonic()
    first: Moment | None = None
    wal_pid: int | None = None
    polls = 0
    next_alive_check = 0.0
    while True:
        now = time.monotonic()
        if now >= next_alive_check:
            alive()
            if wal_pid is None:
                wal_pid = walsender_pid()
            # Checks that cost the relay something are spaced out once it runs.
            next_alive_check = now + (0.5 if first is None else 2.0)
        marks = watermarks.read()
        polls += 1
        records = sum(marks.values())
        now = time.monotonic()
        if records and first is None:
            if wal_pid is None:
                wal_pid = walsender_pid()
            first = _moment(now, records, relay_pids(), wal_pid)
        if records >= expected and (delivered is None or delivered()):
            assert first is not None
            done = _moment(now, records, relay_pids(), wal_pid)
            return Drain(first, done, marks, wal_pid, polls)
        if first is None and now - started > start_timeout:
            raise DrainFailed(
                f"no record in {watermarks.topic} within {start_timeout:g} s of the relay's start"
            )
        if first is not None and now - first.monotonic > drain_timeout:
            raise DrainFailed(
                f"{records:,} of {expected:,} records in {watermarks.topic} after {drain_timeout:g} s"
            )
        time.sleep(interval)


def _consumer(bootstrap: str, eof: bool = False) -> Consumer:
    # read_committed (librdkafka's default, set for the reader's sake): a transactional relay's records are
    # read once committed, and commit markers are never returned.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": eof,
            "isolation.level": "read_committed",
        }
    )


def read_records(bootstrap: str, topic: str, offsets: dict[int, int], timeout: float = 30) -> dict[int, Any]:
    """The record at ``offsets[partition]`` of each partition (a Message), read by assignment."""
    consumer = _consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        found: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(offsets):
            if time.monotonic() > deadline:
                missing = sorted(set(offsets) - set(found))
                raise DrainFailed(f"could not read back {topic}'s partitions {missing} within {timeout:g} s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise DrainFailed(f"reading back {topic}: {msg.error()}")
            p = msg.partition()
            if p not in found and msg.offset() == offsets[p]:
                found[p] = msg
                consumer.pause([TopicPartition(topic, p)])
        return found
    finally:
        consumer.close()


def count_event_ids(
    bootstrap: str, topic: str, high: dict[int, int], timeout: float = 600
) -> tuple[int, int, int]:
    """Read every record of ``topic`` below ``high`` and count them: (records, distinct ``id`` headers,
    records without one). Offsets alone would let a duplicate hide a missing event. A partition is read
    when the consumer reaches its end: its last offset may be a commit marker, which no consumer sees."""
    consumer = _consumer(bootstrap, eof=True)
    ids: set[bytes] = set()
    records = without = 0
    try:
        pending = {p: n for p, n in high.items() if n > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise DrainFailed(f"could not read {topic} back within {timeout:g} s")
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                p, offset = msg.partition(), msg.offset()
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.pop(p, None)
                        continue
                    raise DrainFailed(f"reading back {topic}: {msg.error()}")
                if p not in pending or offset >= high[p]:
                    continue
                records += 1
                found = next((v for k, v in msg.headers() or () if k == "id"), None)
                if found is None:
                    without += 1
                else:
                    ids.add(found)
                if offset + 1 >= high[p]:
                    del pending[p]
    finally:
        consumer.close()
    return records, len(ids), without


def read_last_records(
    bootstrap: str, topic: str, high: dict[int, int], tail: int = 64, timeout: float = 30
) -> dict[int, Any]:
    """The last record below ``high[partition]`` of each partition: read from ``tail`` offsets before it to
    the partition's end (the offset before ``high`` may be a commit marker, not a record)."""
    consumer = _consumer(bootstrap, eof=True)
    try:
        pending = {p for p, n in high.items() if n > 0}
        consumer.assign([TopicPartition(topic, p, max(0, high[p] - tail)) for p in pending])
        found: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise DrainFailed(f"could not read back the end of {topic} within {timeout:g} s")
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                p = msg.partition()
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise DrainFailed(f"reading back {topic}: {msg.error()}")
                    pending.discard(p)
                elif p is not None and msg.offset() < high[p]:
                    found[p] = msg
        return found
    finally:
        consumer.close()


def arrival_span(bootstrap: str, topic: str, low: dict[int, int], high: dict[int, int]) -> tuple[int, int]:
    """(first, last) LogAppendTime in ms over the records between ``low`` and ``high`` (exclusive) of each
    partition: the broker's clock at the append of the first record and of the last one."""
    used = [p for p in high if high[p] > low.get(p, 0)]
    if not used:
        raise DrainFailed(f"{topic} holds no record")
    firsts = read_records(bootstrap, topic, {p: low.get(p, 0) for p in used})
    lasts = read_last_records(bootstrap, topic, {p: high[p] for p in used})
    for msg in list(firsts.values()) + list(lasts.values()):
        kind, _ = msg.timestamp()
        if kind != LOG_APPEND_TIME:
            raise DrainFailed(f"{topic}'s records carry no LogAppendTime (timestamp type {kind})")
    first = min(m.timestamp()[1] for m in firsts.values())
    last = max(m.timestamp()[1] for m in lasts.values())
    return first, last


def describe_record(msg: Any, registry_url: str | None) -> dict[str, Any]:
    """What one record is: key, header names, and its value decoded: JSON text, Confluent-framed Avro
    (resolved through the registry's Confluent-compatible API), or Avro single-object (``C3 01``)."""
    value: bytes = msg.value() or b""
    out: dict[str, Any] = {
        "key": (msg.key() or b"").decode("utf-8", "replace"),
        "headers": [name for name, _ in (msg.headers() or [])],
        "value_bytes": len(value),
    }
    if value[:2] == b"\xc3\x01":
        out["value_format"] = "avro single-object"
        out["fingerprint"] = value[2:10].hex()
        return out
    if value[:1] == b"\x00" and len(value) > 5:
        schema_id = int.from_bytes(value[1:5], "big")
        out["value_format"] = "avro confluent"
        out["schema_id"] = schema_id
        if registry_url:
            try:
                with urllib.request.urlopen(f"{registry_url}/schemas/ids/{schema_id}", timeout=10) as reply:
                    schema = json.loads(json.load(reply)["schema"])
                decoded = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(schema))
            except Exception as exc:  # any way the bytes fail to decode is a finding, reported below
                # Not what it looks like (another framing whose first byte is 0, say): say so, not crash.
                out["value_format"] = "bytes starting with 0x00, not decodable as Confluent-framed Avro"
                out["decode_error"] = f"{type(exc).__name__}: {exc}"
                return out
            out["schema_name"] = schema.get("name") if isinstance(schema, dict) else str(schema)
            out["decoded_fields"] = sorted(decoded) if isinstance(decoded, dict) else type(decoded).__name__
        return out
    try:
        parsed = json.loads(value)
    except ValueError:
        out["value_format"] = "bytes"
        return out
    out["value_format"] = "json text"
    out["decoded_fields"] = sorted(parsed) if isinstance(parsed, dict) else type(parsed).__name__
    return out


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def measure_drain(
    proc: Any,
    *,
    kafka_admin: AdminClient,
    bootstrap: str,
    topic: str,
    partitions: int,
    events: int,
    walsender_pid: Callable[[], int | None],
    alive: Callable[[], None],
    start_timeout: float,
    drain_timeout: float,
    delivered: Callable[[], bool] | None = None,
    kafka_pid: int | None = None,
    registry_url: str | None = None,
) -> dict[str, Any]:
    """One relay's drain of ``events`` into ``topic`` (created with LogAppendTime), measured from the outside:
    ``proc`` (with ``pid``, ``started`` and ``stop()``) is running; it is stopped once all arrived, then the
    topic is read back, every event id counted and one record described. ``ok`` is False when fewer than
    ``events`` distinct ids arrived."""
    machine = MachineCpu()
    kafka_cpu0 = cpu_seconds(kafka_pid)
    marks = Watermarks(kafka_admin, topic, partitions)
    drain = watch_drain(
        watermarks=marks,
        expected=events,
        relay_pids=lambda: [proc.pid],
        walsender_pid=walsender_pid,
        alive=alive,
        start_timeout=start_timeout,
        drain_timeout=drain_timeout,
        delivered=delivered,
    )
    kafka_cpu1 = cpu_seconds(kafka_pid)
    machine_cpu = machine.read()
    peak = vmhwm_mb(proc.pid)
    stop = proc.stop()
    final = marks.read()
    records, distinct, without_id = count_event_ids(bootstrap, topic, final)
    first_ms, last_ms = arrival_span(bootstrap, topic, {}, drain.watermarks_done)
    sample = read_records(bootstrap, topic, {p: 0 for p, n in final.items() if n > 0})
    run: dict[str, Any] = {
        "ok": distinct >= events and not without_id,
        "events": events,
        "records": records,
        "offsets": sum(final.values()),
        "distinct_event_ids": distinct,
        "records_without_id": without_id,
        **figures(
            events=events,
            first_ms=first_ms,
            last_ms=last_ms,
            relay_cpu_s=_spent(drain.first.relay_cpu, drain.done.relay_cpu),
            walsender_cpu_s=drain.done.walsender_cpu,
            window_events=drain.done.records - drain.first.records,
        ),
        "peak_rss_mb": None if peak is None else round(peak, 1),
        "first_record_after_start_s": round(drain.first.monotonic - proc.started, 3),
        "cpu_window": {
            "seconds": round(drain.done.monotonic - drain.first.monotonic, 3),
            "records_at_first_poll": drain.first.records,
            "records_at_last_poll": drain.done.records,
            "relay_cpu_s": _round(_spent(drain.first.relay_cpu, drain.done.relay_cpu)),
            # Which thread spent it: Python's main thread, the span exporter's, librdkafka's (rdk:*).
            "relay_cpu_by_thread_s": {
                name: round(spent - drain.first.relay_threads.get(name, 0.0), 4)
                for name, spent in sorted(drain.done.relay_threads.items())
                if spent - drain.first.relay_threads.get(name, 0.0) > 0
            },
            "walsender_cpu_s": _round(_spent(drain.first.walsender_cpu, drain.done.walsender_cpu)),
            "walsender_cpu_since_its_start_s": _round(drain.done.walsender_cpu),
            "relay_cpu_since_its_start_s": _round(drain.done.relay_cpu),
            "polls": drain.polls,
        },
        "kafka_cpu_s": _round(_spent(kafka_cpu0, kafka_cpu1)),
        "machine_cpu": machine_cpu,
        "sample_record": describe_record(next(iter(sample.values())), registry_url),
        "pid": proc.pid,
        "stop": stop,
    }
    if not run["ok"]:
        run["error"] = f"{distinct:,} distinct events of {events:,} in {records:,} records" + (
            f", {without_id:,} without an id header" if without_id else ""
        )
    return run


def bare_drain(dsn: str, *, slot: str, publication: str, events: int, timeout: float) -> dict[str, Any]:
    """The bare reader's drain of ``slot`` in a process of its own (``tests.bench.bare_reader``), with the
    figures of :func:`measure_drain`: its arrivals are the Inserts it reads, its CPU is its process's between
    the first and the last, its walsender's all it spent until the last."""
    machine = MachineCpu()
    env = {**os.environ, "CDC_DATABASE_URL": dsn}
    command = [sys.executable, "-m", "tests.bench.bare_reader", "--slot", slot, "--publication", publication]
    command += ["--count", str(events), "--timeout", str(timeout)]
    done = subprocess.run(
        dying_with_parent(command),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    if done.returncode != 0:
        raise DrainFailed(
            f"the bare reader exited with code {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    got = json.loads(done.stdout)
    return {
        "ok": got["events"] >= events,
        "events": got["events"],
        "transport": got["transport"],
        **figures(
            events=events,
            first_ms=got["first_insert_ms"],
            last_ms=got["last_insert_ms"],
            relay_cpu_s=got["cpu_last_s"] - got["cpu_first_s"],
            walsender_cpu_s=got["walsender_cpu_s"],
            window_events=events - 1,  # the first Insert was read when the CPU was first read
        ),
        "peak_rss_mb": None if got["peak_rss_mb"] is None else round(got["peak_rss_mb"], 1),
        "machine_cpu": machine.read(),
        "method": "Inserts counted by the reader's own process: rate from the first Insert read to the last; "
        "CPU of that process between them; its walsender's from its start to the last Insert",
        "reader": got,
    }

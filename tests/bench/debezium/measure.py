"""Measuring one drain from the outside, the same way for every relay: the topic's watermarks polled while it
runs (first arrival, all N arrived, CPU of the relay and of its walsender at those two moments), then the
broker's LogAppendTime of the first and the last record of each partition (the rate), and the relay's
VmHWM (peak RSS)."""

from __future__ import annotations

import io
import json
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.bench.procs import cpu_seconds

LOG_APPEND_TIME = 2  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def vmhwm_mb(pid: int) -> float | None:
    """The peak resident set size of ``pid`` (VmHWM) in MiB, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


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
        """Retries what a new topic answers while its partitions get their leader (not leader, unknown
        partition), for ``retry_for`` s."""
        deadline = time.monotonic() + retry_for
        while True:
            try:
                futures = self._admin.list_offsets(self._request, request_timeout=10)
                return {tp.partition: future.result(timeout=15).offset for tp, future in futures.items()}
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                retriable = isinstance(error, KafkaError) and (error.retriable() or error.code() in _SETTLING)
                if not retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@dataclass
class Moment:
    """What the poll loop saw at one instant."""

    monotonic: float
    records: int
    relay_cpu: float | None
    walsender_cpu: float | None


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
) -> Drain:
    """Poll the topic until it holds ``expected`` records. ``alive()`` raises when the relay died or failed;
    ``walsender_pid()`` gives the slot's active_pid (None while the relay has not connected). The CPU
    figures are read at the poll that first saw a record and at the one that saw them all."""
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
            first = Moment(now, records, total_cpu(relay_pids()), cpu_seconds(wal_pid))
        if records >= expected:
            assert first is not None
            done = Moment(now, records, total_cpu(relay_pids()), cpu_seconds(wal_pid))
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


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-debezium-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
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
    records without one). Offsets alone would let a duplicate hide a missing event."""
    consumer = _consumer(bootstrap)
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
                if msg.error():
                    raise DrainFailed(f"reading back {topic}: {msg.error()}")
                p, offset = msg.partition(), msg.offset()
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


def arrival_span(bootstrap: str, topic: str, low: dict[int, int], high: dict[int, int]) -> tuple[int, int]:
    """(first, last) LogAppendTime in ms over the records between ``low`` and ``high`` (exclusive) of each
    partition: the broker's clock at the append of the first record and of the last one."""
    used = [p for p in high if high[p] > low.get(p, 0)]
    if not used:
        raise DrainFailed(f"{topic} holds no record")
    firsts = read_records(bootstrap, topic, {p: low.get(p, 0) for p in used})
    lasts = read_records(bootstrap, topic, {p: high[p] - 1 for p in used})
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

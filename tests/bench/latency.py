"""Commit-to-ack latency, measured from the consumer's side.

The pipeline stamps every record with its transaction's commit time (ms, truncated), so for each record
``receive time - record timestamp`` bounds commit-to-ack from above: the record's commit precedes its ack,
and after the ack come the consumer's fetch and the hand-over to Python (a poll() that returns as soon as one
record is there, then whatever else is already queued: they all get the time poll() returned). Both
clocks are this machine's wall clock; record timestamps have millisecond resolution.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition


def latency_consumer_config(bootstrap: str, group_id: str) -> dict[str, Any]:
    """A consumer that measures latency: no commits, and a fetch answered within 100 ms."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
        "enable.partition.eof": False,
    }


class LatencyConsumer(threading.Thread):
    """Reads ``topic`` from its end offsets at start-up; keeps one latency (ms) per record."""

    def __init__(self, bootstrap: str, topic: str, group_id: str) -> None:
        super().__init__(name="latency-consumer", daemon=True)
        self.topic = topic
        self.config = latency_consumer_config(bootstrap, group_id)
        self.latencies_ms: list[float] = []
        self.received_at: list[float] = []  # wall-clock seconds, one per record, parallel to latencies_ms
        self.errors: list[str] = []
        self.ready = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.config)
        try:
            metadata = consumer.list_topics(self.topic, timeout=10)
            partitions = sorted(metadata.topics[self.topic].partitions)
            assignment = []
            for p in partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                assignment.append(TopicPartition(self.topic, p, high if high >= 0 else OFFSET_END))
            consumer.assign(assignment)
            self.ready.set()
            append = self.latencies_ms.append
            append_time = self.received_at.append
            while not self._stop_event.is_set():
                # poll() returns as soon as one record is there; consume(timeout=0) then takes what is
                # already queued (consume with a timeout would wait for a full batch or the timeout).
                first = consumer.poll(0.1)
                if first is None:
                    continue
                now = time.time()
                now_ms = now * 1000
                for message in [first, *consumer.consume(num_messages=1000, timeout=0)]:
                    if message.error() is not None:
                        self.errors.append(message.error().str())
                        continue
                    append(now_ms - message.timestamp()[1])
                    append_time(now)
        except KafkaException as exc:
            self.errors.append(str(exc))
        finally:
            self.ready.set()
            consumer.close()

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    def wait_count(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < count:
            if time.monotonic() > deadline or not self.is_alive():
                return False
            time.sleep(0.05)
        return True

    def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """Wait until no record has arrived for ``quiet`` seconds: what the topic held is read (a backlog that
        the pipeline published while this consumer started is not taken for the load's records)."""
        deadline = time.monotonic() + timeout
        last, since = self.count, time.monotonic()
        while time.monotonic() - since < quiet:
            if time.monotonic() > deadline or not self.is_alive():
                return False
            time.sleep(0.05)
            if self.count != last:
                last, since = self.count, time.monotonic()
        return True

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 1)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": round(ordered[-1], 1),
        "min_ms": round(ordered[0], 1),
        "mean_ms": round(sum(ordered) / len(ordered), 1),
    }


def per_second(latencies: list[float], received_at: list[float], origin: float) -> list[dict[str, Any]]:
    """Latency by second of receipt since ``origin`` (wall clock): whether it is steady or building up."""
    buckets: dict[int, list[float]] = {}
    for latency, at in zip(latencies, received_at, strict=True):
        buckets.setdefault(int(at - origin), []).append(latency)
    out = []
    for second in sorted(buckets):
        values = sorted(buckets[second])
        out.append(
            {
                "second": second,
                "records": len(values),
                "p50_ms": round(values[len(values) // 2], 1),
                "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1),
                "max_ms": round(values[-1], 1),
            }
        )
    return out

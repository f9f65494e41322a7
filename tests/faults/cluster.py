"""What the fault suite asks of the three-broker cluster (``--brokers 3``): who leads which partition, who is
in sync, and waits on both, from the cluster's own metadata (an AdminClient on every broker).

Every wait has a bound: ``IN_SYNC_TIMEOUT`` for the replicas to catch up after a restart (a restarted broker
fetches the few MB it missed in seconds; two minutes leave room for a loaded 2-core machine), and
``ISR_DROP_TIMEOUT`` for the in-sync replicas to shrink after brokers went down (a killed broker leaves the
ISR when the controller fences it, ``broker.session.timeout.ms`` = 9 s after its last heartbeat).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.faults.readback import watermarks

IN_SYNC_TIMEOUT = 120.0
ISR_DROP_TIMEOUT = 30.0
# A leader that has just taken over answers OFFSET_NOT_AVAILABLE until its high watermark has caught up.
WATERMARK_TIMEOUT = 30.0
MIN_INSYNC = 2  # the cluster's min.insync.replicas (stack/cluster.sh)


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    leader: int  # -1 when it has none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def node_name(broker_id: int) -> str:
    """stack/cluster.sh's name of broker ``broker_id`` (node.id N is bN)."""
    return f"b{broker_id}"


class ClusterView:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        # Short timeouts: a metadata request that meets a dead broker is retried by the caller's loop.
        # log_level 2: the connection errors to the brokers the suite took down are expected.
        self._admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000, "log_level": 2})

    def partitions(self, topics: list[str] | None = None) -> list[PartitionState]:
        """Every partition of ``topics`` (of every topic, internal ones included, when None)."""
        metadata = self._admin.list_topics(timeout=10)
        out = []
        for name, topic in metadata.topics.items():
            if topics is not None and name not in topics:
                continue
            if topic.error is not None:
                raise KafkaException(topic.error)
            for p in topic.partitions.values():
                out.append(PartitionState(name, p.id, p.leader, tuple(p.replicas), tuple(p.isrs)))
        return out

    def busiest_leader(self, topic: str) -> tuple[str, int]:
        """(node, partition): the leader of the partition of ``topic`` that holds the most records, the one
        the load has written to most."""
        marks = self._watermarks(topic)
        leaders = {p.partition: p.leader for p in self.partitions([topic])}
        partition = max(marks, key=lambda p: marks[p][1])
        if leaders.get(partition, -1) < 0:
            raise RuntimeError(f"{topic}[{partition}] has no leader")
        return node_name(leaders[partition]), partition

    def wait_in_sync(self, timeout: float = IN_SYNC_TIMEOUT) -> float:
        """Until every partition of every topic has all its replicas in sync and a leader: the seconds it
        took. RuntimeError after ``timeout``, naming what was still behind."""
        started = time.monotonic()
        behind: list[str] = ["(no metadata yet)"]
        while time.monotonic() - started < timeout:
            try:
                states = self.partitions()
                behind = [
                    f"{s.topic}[{s.partition}] isr={list(s.isr)} of {list(s.replicas)}"
                    for s in states
                    if s.leader < 0 or set(s.isr) != set(s.replicas)
                ]
                if not behind:
                    return time.monotonic() - started
            except KafkaException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"replicas not in sync {timeout:g} s after the restart: {', '.join(behind[:5])}")

    def wait_isr_below_min(self, topics: list[str], timeout: float = ISR_DROP_TIMEOUT) -> float:
        """Until every partition of ``topics`` has fewer than ``MIN_INSYNC`` in-sync replicas: the seconds it
        took. RuntimeError after ``timeout``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if self.isr_below_min(topics):
                    return time.monotonic() - started
            except KafkaException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"in-sync replicas of {topics} not below {MIN_INSYNC} after {timeout:g} s")

    def isr_below_min(self, topics: list[str]) -> bool:
        states = self.partitions(topics)
        return bool(states) and all(len(s.isr) < MIN_INSYNC for s in states)

    def _watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        deadline = time.monotonic() + WATERMARK_TIMEOUT
        while True:
            try:
                return watermarks(self.bootstrap, topic)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

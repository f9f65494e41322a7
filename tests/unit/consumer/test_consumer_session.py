"""How the consumer session asks librdkafka for records and keeps track of offsets, with a fake consumer:
the calls themselves are what matters here (the real Kafka runs in tests/integration/consumer)."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition

from cdc.consumer import IdempotentConsumer
from tests.unit.consumer.offline import offline_consumer

TOPIC = "outbox.event.order"  # offline_consumer's topic


class QueueConsumer:
    """librdkafka's consume(n, timeout) over a queue: it returns once it has n records or the timeout
    passed; records that "arrive" while it waits are the ``arriving`` list."""

    def __init__(self, queued: int, arriving: int = 0) -> None:
        self.queued, self.arriving = list(range(queued)), list(range(queued, queued + arriving))
        self.calls: list[tuple[int, float]] = []
        self.waited = 0.0
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []

    def consume(self, num_messages: int, timeout: float) -> list[int]:
        self.calls.append((num_messages, timeout))
        if len(self.queued) < num_messages and timeout > 0:
            self.queued += self.arriving
            self.arriving = []
            if len(self.queued) < num_messages:
                self.waited += timeout  # waits for records that do not come
        taken, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return taken

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous))
        return offsets


def service(kafka: QueueConsumer) -> IdempotentConsumer:
    consumer = offline_consumer(poll_timeout=0.5)
    consumer._consumer = kafka
    return consumer


def test_a_batch_takes_what_is_queued_without_waiting_for_a_full_one() -> None:
    kafka = QueueConsumer(queued=3)
    assert service(kafka)._poll(1000) == [0, 1, 2]
    assert kafka.waited == 0, "a consumer that keeps up must not hold its records for poll_timeout"


def test_an_empty_queue_waits_for_the_first_record_then_takes_what_came_with_it() -> None:
    kafka = QueueConsumer(queued=0, arriving=2)
    assert service(kafka)._poll(1000) == [0, 1]
    assert kafka.waited == 0 and kafka.calls == [(1000, 0), (1, 0.5), (999, 0)]


def test_nothing_arriving_is_one_bounded_wait() -> None:
    kafka = QueueConsumer(queued=0)
    assert service(kafka)._poll(1000) == []
    assert kafka.waited == 0.5


class Record:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def test_offsets_are_committed_asynchronously_and_pending_until_confirmed() -> None:
    kafka = QueueConsumer(queued=0)
    consumer = service(kafka)
    consumer._commit(Record(0, 41), Record(1, 7))
    assert kafka.commits == [([(TOPIC, 0, 42), (TOPIC, 1, 8)], True)]
    assert consumer._pending == {(TOPIC, 0): 42, (TOPIC, 1): 8}

    consumer._on_committed(KafkaError(KafkaError.REQUEST_TIMED_OUT), [])
    assert len(consumer._pending) == 2, "a failed commit stays pending"
    consumer._commit(Record(0, 50))  # partition 0 moved on before the first commit was confirmed
    consumer._on_committed(None, [TopicPartition(TOPIC, 0, 42), TopicPartition(TOPIC, 1, 8)])
    assert consumer._pending == {(TOPIC, 0): 51}, "only what the broker confirmed is done"


def test_a_revocation_commits_what_is_pending_synchronously() -> None:
    kafka = QueueConsumer(queued=0)
    consumer = service(kafka)
    consumer._commit(Record(2, 9))
    consumer._on_revoke(kafka, [TopicPartition(TOPIC, 2)])
    assert kafka.commits[-1] == ([(TOPIC, 2, 10)], False)
    assert consumer._pending == {}

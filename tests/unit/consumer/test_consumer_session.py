"""The consumer's session (cdc.consumer.session.Session) with a fake librdkafka consumer: how it asks for
records, and its offset bookkeeping through commits, their confirmations and rebalances. The calls themselves
are what matters here (the real Kafka runs in tests/integration/consumer)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cdc.consumer.session import Session
from cdc.errors import ConsumerError
from tests.unit.consumer.fakes import TOPIC, Record


class QueueConsumer:
    """librdkafka's consume(n, timeout) over a queue: it returns once it has n records or the timeout
    passed; records that "arrive" while it waits are the ``arriving`` list. It keeps the settings and the
    callbacks it was given, for the test to play librdkafka's part with them."""

    def __init__(self, queued: int = 0, arriving: int = 0) -> None:
        self.queued = [Record(f"e-{n}", offset=n) for n in range(queued)]
        self.arriving = [Record(f"e-{n}", offset=n) for n in range(queued, queued + arriving)]
        self.calls: list[tuple[int, float]] = []
        self.waited = 0.0
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []
        self.conf: dict[str, Any] = {}
        self.subscribed: dict[str, Any] = {}
        self.refuse: KafkaError | None = None  # the next commit raises it
        self.closed = False

    def __call__(self, conf: dict[str, Any]) -> QueueConsumer:  # as confluent_kafka.Consumer(conf)
        self.conf = conf
        return self

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.subscribed = {"topics": topics, **callbacks}

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        self.calls.append((num_messages, timeout))
        if len(self.queued) < num_messages and timeout > 0:
            self.queued += self.arriving
            self.arriving = []
            if len(self.queued) < num_messages:
                self.waited += timeout  # waits for records that do not come
        taken, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return taken

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise KafkaException(error)
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous))
        return offsets

    def close(self) -> None:
        self.closed = True

    # librdkafka's side: callbacks it calls inside consume() or close()
    def confirm(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self.conf["on_commit"](error, partitions)

    def revoke(self, *partitions: int) -> None:
        self.subscribed["on_revoke"](self, [TopicPartition(TOPIC, p) for p in partitions])

    def lose(self, *partitions: int) -> None:
        self.subscribed["on_lost"](self, [TopicPartition(TOPIC, p) for p in partitions])


def session(kafka: QueueConsumer) -> Session:
    opened = Session(
        {"group.id": "inv", "bootstrap.servers": "k:1"}, [TOPIC], name="inv", poll_timeout=0.5, kafka=kafka
    )
    opened.open()
    return opened


def test_it_joins_the_group_with_its_settings_and_its_own_callbacks() -> None:
    kafka = QueueConsumer()
    session(kafka)
    assert kafka.conf["group.id"] == "inv" and callable(kafka.conf["on_commit"])
    assert kafka.subscribed["topics"] == [TOPIC]
    assert {"on_assign", "on_revoke", "on_lost"} <= set(kafka.subscribed)


def test_a_batch_takes_what_is_queued_without_waiting_for_a_full_one() -> None:
    kafka = QueueConsumer(queued=3)
    assert [r.offset() for r in session(kafka).poll(1000)] == [0, 1, 2]
    assert kafka.waited == 0, "a consumer that keeps up must not hold its records for poll_timeout"


def test_an_empty_queue_waits_for_the_first_record_then_takes_what_came_with_it() -> None:
    kafka = QueueConsumer(queued=0, arriving=2)
    assert [r.offset() for r in session(kafka).poll(1000)] == [0, 1]
    assert kafka.waited == 0 and kafka.calls == [(1000, 0), (1, 0.5), (999, 0)]


def test_nothing_arriving_is_one_bounded_wait() -> None:
    kafka = QueueConsumer(queued=0)
    assert session(kafka).poll(1000) == []
    assert kafka.waited == 0.5


class Failure:
    def __init__(self, fatal: bool) -> None:
        self._fatal = fatal

    def fatal(self) -> bool:
        return self._fatal

    def str(self) -> str:
        return "broker down" if self._fatal else "partition EOF"


def test_a_kafka_error_in_the_records_is_left_out_and_a_fatal_one_stops_the_consumer() -> None:
    kafka = QueueConsumer(queued=2)
    kafka.queued.insert(1, Record(None, error=Failure(fatal=False)))
    assert [r.offset() for r in session(kafka).poll(10)] == [0, 1]
    kafka = QueueConsumer(queued=2)
    kafka.queued.insert(1, Record(None, error=Failure(fatal=True)))
    with pytest.raises(ConsumerError, match="Kafka consumer failed: broker down"):
        session(kafka).poll(10)


def test_offsets_are_committed_asynchronously_and_pending_until_confirmed() -> None:
    kafka = QueueConsumer()
    group = session(kafka)
    group.done(Record("a", partition=0, offset=41), Record("b", partition=1, offset=7))
    assert kafka.commits == [([(TOPIC, 0, 42), (TOPIC, 1, 8)], True)]
    assert group.pending == {(TOPIC, 0): 42, (TOPIC, 1): 8}

    kafka.confirm(KafkaError(KafkaError.REQUEST_TIMED_OUT), [])
    assert len(group.pending) == 2, "a failed commit stays pending"
    group.done(Record("c", partition=0, offset=50))  # partition 0 moved on before the first was confirmed
    assert kafka.commits[-1] == ([(TOPIC, 0, 51), (TOPIC, 1, 8)], True), "the next commit carries it"
    kafka.confirm(None, [TopicPartition(TOPIC, 0, 42), TopicPartition(TOPIC, 1, 8)])
    assert group.pending == {(TOPIC, 0): 51}, "only what the broker confirmed is done"


def test_a_commit_kafka_refuses_at_once_stays_pending() -> None:
    kafka = QueueConsumer()
    group = session(kafka)
    kafka.refuse = KafkaError(KafkaError._NO_OFFSET)
    group.done(Record("a", partition=3, offset=4))
    assert kafka.commits == [] and group.pending == {(TOPIC, 3): 5}


def test_a_revocation_commits_what_is_pending_synchronously() -> None:
    kafka = QueueConsumer()
    group = session(kafka)
    group.done(Record("a", partition=2, offset=9), Record("b", partition=3, offset=1))
    kafka.revoke(2)
    assert kafka.commits[-1] == ([(TOPIC, 2, 10)], False)
    assert group.pending == {(TOPIC, 3): 2}, "the partitions kept are not touched"


def test_a_lost_partition_is_forgotten_without_a_commit() -> None:
    kafka = QueueConsumer()
    group = session(kafka)
    group.done(Record("a", partition=2, offset=9))
    kafka.lose(2)
    assert group.pending == {} and len(kafka.commits) == 1


def test_close_leaves_the_group_and_a_session_never_opened_closes_quietly() -> None:
    kafka = QueueConsumer()
    session(kafka).close()
    assert kafka.closed
    Session({"group.id": "g"}, [TOPIC], name="inv", poll_timeout=0.5, kafka=kafka).close()

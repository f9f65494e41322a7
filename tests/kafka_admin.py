"""The test harness's Kafka admin calls (the tests' fixtures, the benches, the soak, the fault suite), each
asked again while the broker settles, as the package's own are (:mod:`cdc.stream.admin`): a stack started a
moment ago answers "coordinator loading" or "no leader yet" for a few seconds, which is not a failure of the
run. Every wait is bounded by SETTLE_TIMEOUT.

Committed offsets are read by a Consumer of the group (:func:`committed_offsets`), never by the admin
client's list_consumer_group_offsets, which crashes librdkafka (cdc.stream.admin says when).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cdc.stream.admin import ask

SETTLE_TIMEOUT: Final = 60.0  # seconds each call may ask again for: a stack just started, on a busy machine
REQUEST_TIMEOUT: Final = 30.0  # one request


def create_topics(admin: AdminClient, topics: Iterable[NewTopic], *, exist_ok: bool = False) -> None:
    """Create ``topics``; one that exists already is an error unless ``exist_ok``, or unless an earlier
    attempt of this call created it."""
    pending = {t.topic: t for t in topics}
    attempts = 0

    def attempt(left: float) -> None:
        nonlocal attempts
        attempts += 1
        wait = min(left, REQUEST_TIMEOUT)
        futures = admin.create_topics(list(pending.values()), operation_timeout=wait, request_timeout=wait)
        first: KafkaException | None = None
        for name, future in futures.items():
            try:
                future.result(timeout=wait + 30)
            except KafkaException as exc:
                exists = exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
                if not (exists and (exist_ok or attempts > 1)):
                    first = first or exc
                    continue
            del pending[name]
        if first is not None:
            raise first

    if pending:
        ask(attempt, what=f"create topics {', '.join(pending)}", bound=SETTLE_TIMEOUT)


def create_topic(admin: AdminClient, name: str, partitions: int = 1, **config: str) -> None:
    create_topics(admin, [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])


def topic_names(admin: AdminClient) -> set[str]:
    return set(
        ask(
            lambda left: admin.list_topics(timeout=min(left, REQUEST_TIMEOUT)),
            what="topics",
            bound=SETTLE_TIMEOUT,
        ).topics
    )


def delete_topics(admin: AdminClient, names: Iterable[str]) -> None:
    """Delete those of ``names`` that exist."""
    wanted = set(names)

    def attempt(left: float) -> None:
        doomed = sorted(wanted & topic_names(admin))
        if not doomed:
            return
        wait = min(left, REQUEST_TIMEOUT)
        for future in admin.delete_topics(doomed, operation_timeout=wait, request_timeout=wait).values():
            try:
                future.result(timeout=wait + 30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:  # gone meanwhile
                    raise

    ask(attempt, what="delete topics", bound=SETTLE_TIMEOUT)


def delete_topics_with_prefix(admin: AdminClient, prefix: str) -> None:
    delete_topics(admin, [t for t in topic_names(admin) if t.startswith(prefix)])


def delete_groups(admin: AdminClient, groups: Iterable[str], *, members_leave: float = 0) -> None:
    """Delete those of ``groups`` that exist. One that still has members (a consumer killed a moment ago
    stays a member until its session times out) is asked for again for up to ``members_leave`` s."""
    wanted = set(groups)
    deadline = time.monotonic() + members_leave
    while True:
        try:
            _delete_groups(admin, wanted)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.NON_EMPTY_GROUP or time.monotonic() > deadline:
                raise
        time.sleep(1)


def _delete_groups(admin: AdminClient, wanted: set[str]) -> None:

    def attempt(left: float) -> None:
        wait = min(left, REQUEST_TIMEOUT)
        listed = admin.list_consumer_groups(request_timeout=wait).result(timeout=wait + 5)
        doomed = sorted(wanted & {g.group_id for g in listed.valid})
        if not doomed:
            return
        for future in admin.delete_consumer_groups(doomed, request_timeout=wait).values():
            try:
                future.result(timeout=wait + 5)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
                    raise

    ask(attempt, what=f"delete groups {', '.join(sorted(wanted))}", bound=SETTLE_TIMEOUT)


def committed_offsets(consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
    """The committed offsets of ``consumer``'s group (OFFSET_INVALID where none): a consumer of the group
    that need not have joined it."""
    found: list[TopicPartition] = ask(
        lambda left: consumer.committed(partitions, timeout=min(left, REQUEST_TIMEOUT)),
        what="committed offsets",
        bound=SETTLE_TIMEOUT,
    )
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return found


def settled(call: Any, what: str) -> Any:
    """``call(seconds_left)`` of any other admin request, asked again while the broker settles."""
    return ask(call, what=what, bound=SETTLE_TIMEOUT)

"""Kafka's admin and metadata requests, asked again while the cluster settles.

A broker that has just started answers for a few seconds with errors that only say "not yet": its group
coordinator loads ``__consumer_offsets`` (``COORDINATOR_LOAD_IN_PROGRESS``), or has not created it yet on a
new cluster (``COORDINATOR_NOT_AVAILABLE``, ``NOT_COORDINATOR``); its partitions have no leader until it has
caught up with the controller (``LEADER_NOT_AVAILABLE``, ``NOT_LEADER_FOR_PARTITION``); a topic created a
moment ago is not yet known to the broker that answers (``UNKNOWN_TOPIC_OR_PART``). A leader or coordinator
that moves (a broker restarted in a cluster) answers the same. librdkafka retries some of them inside a
request, not all, and not for long: :func:`ask` asks again, with a short backoff, until the answer is
something else or a bound has passed (every caller takes it from a setting: ``startup_timeout``), then
raises the last error.

Every caller of Kafka's admin API in the package goes through here: `cdc run`'s start (its topics, their
record limit, its rights), `cdc dlq`, `cdc audit` and `cdc status` (cdc.ops); the soak, the benches and the
tests too.

Not through here: ``AdminClient.list_consumer_group_offsets``, which nothing in the project calls. In
librdkafka up to 2.16.0 at least (confluent-kafka 2.16.2, the newest), an answer ``NOT_COORDINATOR`` or
``COORDINATOR_NOT_AVAILABLE`` to it makes librdkafka's own thread dereference the consumer group of a client
that has none (``rd_kafka_handle_OffsetFetch`` calls ``rd_kafka_cgrp_op(rk->rk_cgrp)``, NULL in an admin
client): a segmentation fault, whenever the group's coordinator is starting or moving (librdkafka issue
5040). A group's committed offsets are read by a Consumer of that group (``Consumer.committed``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, TypeVar

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger("cdc.kafka.admin")
T = TypeVar("T")

# "Not yet" answers: a coordinator or a leader still starting, or moving.
SETTLING: Final = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_LEADER_EPOCH,  # a leader just elected: the client's metadata is behind it
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,  # ListOffsets before a new leader's high watermark caught up
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.NOT_CONTROLLER,
        KafkaError._WAIT_COORD,
    }
)
FIRST_BACKOFF: Final = 0.1  # seconds before the second attempt, doubled after each one
MAX_BACKOFF: Final = 1.0
MIN_ATTEMPT: Final = 1.0  # seconds: the least one attempt is given, even at the end of the bound


def kafka_error(exc: BaseException | None) -> KafkaError | None:
    """The KafkaError in ``exc`` or in the exceptions it was raised from (a CdcError wraps a KafkaException
    with ``raise ... from``)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0]
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def settling(error: BaseException | KafkaError | None, *, topic_expected: bool = False) -> bool:
    """Whether the error says only "not yet". ``topic_expected``: the topic is known to exist (listed, or
    just created), so that "unknown topic" is a broker that has not heard of it yet."""
    err = error if isinstance(error, KafkaError) else kafka_error(error)
    if err is None:
        return False
    code = err.code()
    return code in SETTLING or (topic_expected and code == KafkaError.UNKNOWN_TOPIC_OR_PART)


def ask(
    call: Callable[[float], T],
    *,
    what: str,
    bound: float,
    topic_expected: bool = False,
) -> T:
    """``call(seconds_left)`` until it returns, raises an error that is not "not yet" (:func:`settling`), or
    ``bound`` seconds have passed: then its last error is raised. ``seconds_left`` is what the bound leaves
    (at least MIN_ATTEMPT), for the call to bound its own requests by. ``what`` names the request in the one
    INFO line logged when a first "not yet" is met."""
    deadline = time.monotonic() + bound
    backoff, told = FIRST_BACKOFF, False
    while True:
        try:
            return call(max(deadline - time.monotonic(), MIN_ATTEMPT))
        except Exception as exc:
            if not settling(exc, topic_expected=topic_expected) or time.monotonic() + backoff >= deadline:
                raise
            if not told:
                told = True
                err = kafka_error(exc)
                log.info(
                    "%s: Kafka answered %s (a broker or coordinator that is starting or moving): asking "
                    "again for up to %g s",
                    what,
                    err.name() if err is not None else type(exc).__name__,
                    bound,
                )
        time.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)


def metadata_settling(error: KafkaError | None) -> bool:
    """A topic's or partition's metadata error that says "not yet" (no leader elected yet)."""
    return error is not None and settling(error)


def raise_if_settling(error: KafkaError | None) -> None:
    """Raise ``error`` as a KafkaException when it says "not yet", so that :func:`ask` asks again."""
    if metadata_settling(error):
        raise KafkaException(error)

"""What :class:`cdc.consumer.IdempotentConsumer` does with a record whose processing failed (pure rules).

:func:`classify` sorts the exception:

- :class:`RetryableError` (and PostgreSQL's serialization failure, deadlock, lock timeout): rolled back and
  retried with exponential backoff, ``retry.attempts`` times in all. When that is exhausted the consumer
  stops by default (:class:`RetriesExhaustedError`, offset not committed), because a transient error is
  usually an outage that every following event would hit too: dead-lettering them all would empty the
  partition into the dead-letter topic and break per-aggregate order. ``on_retries_exhausted="dead_letter"``
  treats it as permanent instead.
- :class:`PermanentError`, and :class:`DeserializationError`: rolled back, the record goes to the service's
  dead-letter topic with the reason in its headers, its offset is committed and the partition moves on. It is
  *not* marked processed, so a later replay of the record from the dead-letter topic is handled.
- anything else is a bug or an outage the library cannot judge: rolled back, offset not committed, and the
  exception leaves :meth:`~cdc.consumer.IdempotentConsumer.run`, so the process exits and its restart
  reads the record again. The library does not reconnect to PostgreSQL either: a restart is the one
  recovery path.

Dead-letter records keep the original key, value, timestamp and headers; the error's headers come first
(:func:`dead_letter_headers`): ``error_class``, ``error_reason``, ``error_message``, ``original_topic``,
``original_partition``, ``original_offset``, ``consumer``.

A dead letter must always fit, or the record that failed would stop the consumer after all: when the
producer or the dead-letter topic refuses it as too large, it is sent again smaller
(:func:`dead_letter_records`): first without the record's own headers but its ``id`` and with the key cut to
``KEY_LIMIT`` bytes, then without the value too. A ``reduced`` header says what was left out; the
``original_*`` headers still say where the whole record is.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from psycopg import errors as pg_errors

from cdc.avro.deserialize import KafkaMessage
from cdc.errors import (
    ConfigError,
    DeserializationError,
    PermanentError,
    RetriesExhaustedError,
    RetryableError,
)

__all__ = [
    "KEY_LIMIT",
    "DeadLetterRecord",
    "Disposition",
    "RetryPolicy",
    "classify",
    "dead_letter_headers",
    "dead_letter_records",
    "error_name",
    "error_reason",
    "record_at",
]

Disposition = Literal["retry", "dead_letter", "crash"]

# PostgreSQL's own transient failures: retrying the whole transaction is the documented remedy.
_PG_TRANSIENT = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)
_MESSAGE_LIMIT = 2000  # characters of error_message: a header, not a log file
_REDUCED_MESSAGE_LIMIT = 500  # in a reduced dead letter, which must fit even a small message.max.bytes
KEY_LIMIT = 256  # bytes of the key (and of the id header) a reduced dead letter keeps

DeadLetterRecord = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]  # key, value, headers


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``attempts`` in all (so ``attempts - 1`` sleeps); sleep n is ``initial * multiplier**(n-1)`` capped at
    ``max_delay``, shortened by up to ``jitter`` (a fraction) so that consumers do not retry in lockstep."""

    attempts: int = 5
    initial: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.initial < 0 or self.multiplier < 1 or self.max_delay < self.initial:
            raise ConfigError(
                f"invalid retry policy {self}: need attempts >= 1, multiplier >= 1, "
                "0 <= initial <= max_delay",
                key="retry",
            )
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"retry jitter must be in [0, 1), got {self.jitter}", key="retry")

    def schedule(self) -> list[float]:
        """The longest sleep before each retry (no jitter)."""
        return [min(self.max_delay, self.initial * self.multiplier**n) for n in range(self.attempts - 1)]

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The sleep after failed attempt ``attempt`` (1-based)."""
        base = min(self.max_delay, self.initial * self.multiplier ** (attempt - 1))
        return base * (1 - self.jitter * rand())

    def worst_case(self) -> float:
        return sum(self.schedule())


def classify(exc: BaseException) -> Disposition:
    """What the consumer does with a record whose processing raised ``exc`` (module docstring)."""
    if isinstance(exc, RetryableError) or isinstance(exc, _PG_TRANSIENT):
        return "retry"
    if isinstance(exc, PermanentError | DeserializationError):
        return "dead_letter"
    return "crash"


def error_reason(exc: BaseException) -> str:
    if isinstance(exc, PermanentError):
        return exc.reason
    if isinstance(exc, DeserializationError):
        return "undecodable"
    if isinstance(exc, RetriesExhaustedError):
        return "retries_exhausted"
    return "error"


def error_name(exc: BaseException) -> str:
    """The exception as logs name it: its class, and its reason when it makes a dead letter (never its
    message, which may hold values)."""
    if classify(exc) == "dead_letter":
        return f"{type(exc).__name__} ({error_reason(exc)})"
    return type(exc).__name__


def record_at(message: KafkaMessage) -> str:
    """Where a record is, as logs and errors name it: ``topic[partition]@offset``."""
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"


def dead_letter_headers(message: KafkaMessage, exc: BaseException, consumer: str) -> list[tuple[str, bytes]]:
    """The error's headers first, then the record's own: readers take the first of a name as the error's."""
    own = [(k, v or b"") for k, v in message.headers() or ()]
    return _error_headers(message, exc, consumer, _MESSAGE_LIMIT) + own


def dead_letter_records(
    message: KafkaMessage, exc: BaseException, consumer: str
) -> Iterator[DeadLetterRecord]:
    """The dead letter of ``message``, then smaller versions of it, each for when the previous one was refused
    as too large (module docstring)."""
    key, value = message.key(), message.value()
    yield key, value, dead_letter_headers(message, exc, consumer)
    error = _error_headers(message, exc, consumer, _REDUCED_MESSAGE_LIMIT)
    error += [("id", (v or b"")[:KEY_LIMIT]) for k, v in message.headers() or () if k == "id"][:1]
    left_out = "the record's own headers but id"
    if key is not None and len(key) > KEY_LIMIT:
        key, left_out = key[:KEY_LIMIT], f"{left_out}, the key after {KEY_LIMIT} bytes"
    yield key, value, [*error, ("reduced", f"left out: {left_out}".encode())]
    yield key, None, [*error, ("reduced", f"left out: the value, {left_out}".encode())]


def _error_headers(
    message: KafkaMessage, exc: BaseException, consumer: str, limit: int
) -> list[tuple[str, bytes]]:
    error: list[tuple[str, str]] = [
        ("error_class", type(exc).__name__),
        ("error_reason", error_reason(exc)),
        ("error_message", str(exc)[:limit]),
        ("original_topic", message.topic() or ""),
        ("original_partition", str(message.partition())),
        ("original_offset", str(message.offset())),
        ("consumer", consumer),
    ]
    return [(k, v.encode()) for k, v in error]

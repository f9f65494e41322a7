"""Records Kafka refuses: which one was at fault, found without losing any and without reordering a key.

A broker refuses a whole produce batch when one record in it is too large for the topic or invalid for its
settings, and it says so for every record of the batch alike. The producer runs with
``enable.gapless.guarantee``, so after such a refusal nothing more is appended to that partition: the
pipeline stops producing, replays from the slot, and meets the refused records again. This ledger tells it
what to do with each of them then:

- a *suspect* (refused, maybe only for its batch-mates) is produced alone: the producer's queue is emptied
  before and after it, so whatever Kafka says is about this record only. A size refusal is first given
  one replay with the topics' limits read again (which finds a large record before it is sent, and makes
  the batches fit); it goes alone when it is refused again;
- a *culprit* (refused again while alone) goes to the dead-letter topic with Kafka's reason.

Records are known by a digest of (topic, key, value): the replayed record is encoded to the same bytes.
The ledger lives as long as the process; a restart finds the culprit again the same way.

The size bound is here too: before producing into a topic whose ``max.message.bytes`` is below what the
producer may send, each record is checked against the topic's limit, so that the common case, one large
event, goes to the dead-letter topic at once rather than after a refusal and a replay.

Pure bookkeeping: no I/O, no Kafka import.
"""

from __future__ import annotations

import hashlib

from cdc.errors import DeliveryError, EventError, EventRefusedError, EventTooLargeError

# Kafka error codes for a refusal that is a record's fault, not the cluster's: retrying it as it is can
# never succeed. MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE (above segment.bytes), INVALID_TIMESTAMP
# (outside message.timestamp.before/after.max.ms), INVALID_RECORD (e.g. no key on a compacted topic).
SIZE_REFUSALS = frozenset({10, 18})
REFUSAL_CODES = SIZE_REFUSALS | {32, 87}
GAPLESS_STOP = -148  # librdkafka's ERR__GAPLESS_GUARANTEE: the producer stopped on a refused batch

# How many refusals of one record (in batches, then alone) or without a report at one position the
# pipeline replays before it gives up and stops.
MAX_REFUSALS = 3
MAX_REMEMBERED = 100_000  # records: bounded, oldest forgotten first (a forgotten one is found again)

# A record batch's framing (61 bytes), per-record varints and lz4's frame and worst-case expansion on
# incompressible bytes (1/255): what a record of ``raw`` bytes may take on the broker, at most.
BATCH_OVERHEAD = 256
EXPANSION_DIVISOR = 250


def record_digest(topic: str, key: bytes | None, value: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(topic.encode())
    h.update(b"\x00")
    if key is not None:
        h.update(len(key).to_bytes(4, "big"))
        h.update(key)
    else:
        h.update(b"\xff\xff\xff\xff")
    h.update(value or b"")
    return h.digest()


def worst_case_size(raw: int) -> int:
    """The most bytes ``raw`` bytes of key, value and headers may take in a record batch on the broker."""
    return raw + raw // EXPANSION_DIVISOR + BATCH_OVERHEAD


def safe_batch_size(topic_limit: int) -> int:
    """The largest producer ``batch.size`` whose batches always fit a topic of ``topic_limit`` bytes."""
    return max(1, (topic_limit - BATCH_OVERHEAD) * EXPANSION_DIVISOR // (EXPANSION_DIVISOR + 1))


def error_code(error: object) -> int | None:
    code = getattr(error, "code", None)
    if not callable(code):
        return None
    value = code()
    return value if isinstance(value, int) else None


def error_text(error: object) -> str:
    text = getattr(error, "str", None)
    return str(text()) if callable(text) else str(error)


class RefusalLedger:
    """Suspects and culprits, by record digest."""

    def __init__(self) -> None:
        self._refusals: dict[bytes, tuple[int, object]] = {}  # digest -> (times refused, Kafka's error)
        self._culprits: dict[bytes, object] = {}  # digest -> Kafka's error when refused alone
        self._blind: tuple[int, int] = (-1, 0)  # (confirmed LSN, count) of refusals without any report
        self._until = 0  # every refused record was read before this WAL position
        # Whether any record is under suspicion: the hot path reads this once per event, as an attribute.
        self.active = False

    def note(self, refused: list[tuple[bytes, object]], *, alone: bytes | None, at: int, until: int) -> None:
        """Records Kafka refused in one incident, the slot confirmed up to ``at`` and the stream read up to
        ``until``; ``alone`` is the record that was produced alone at the time, if one was: when it is
        refused, it is the culprit. A record
        refused too often ends the run, and so do refusals without any record named (confluent-kafka can
        lose the reports to the fatal error) that recur with nothing confirmed in between."""
        if alone is not None and not any(digest == alone for digest, _ in refused):
            # Alone, so the refusal is its own, reported or not.
            error = refused[0][1] if refused else self._refusals.get(alone, (0, "refused alone"))[1]
            refused = [*refused, (alone, error)]
        if not refused:
            lsn, count = self._blind
            self._blind = (at, count + 1 if lsn == at else 1)
            if self._blind[1] > MAX_REFUSALS:
                raise DeliveryError(
                    f"Kafka refused records {self._blind[1]} times at the same position, and the producer "
                    "reported none of them: check the topics' max.message.bytes and timestamp settings"
                )
        self._until = max(self._until, until)
        self.active = True
        for digest, error in refused:
            times = self._refusals.pop(digest, (0, None))[0] + 1
            if times > MAX_REFUSALS + 1:
                raise DeliveryError(
                    f"Kafka refused the same record {times} times, even alone and as a reduced dead letter: "
                    f"{error_text(error)}. Check the topics' max.message.bytes and the dead-letter topic"
                )
            self._refusals[digest] = (times, error)
            if digest == alone:
                self._culprits[digest] = error
        while len(self._refusals) > MAX_REMEMBERED:
            del self._refusals[next(iter(self._refusals))]
        for digest in list(self._culprits):
            if digest not in self._refusals:
                del self._culprits[digest]

    def must_go_alone(self, digest: bytes) -> bool:
        """Whether the record is produced alone. A size refusal is first taken for its batch's (the replay
        reads the topics' limits again and makes the batches fit them); refused again, or refused for
        anything else, it goes alone."""
        entry = self._refusals.get(digest)
        if entry is None or digest in self._culprits:
            return False
        times, error = entry
        return times > 1 or error_code(error) not in SIZE_REFUSALS

    def culprit_error(self, digest: bytes, topic: str) -> EventError | None:
        """The event error for a record Kafka refused alone, or None when it is no culprit."""
        error = self._culprits.get(digest)
        if error is None:
            return None
        if error_code(error) in SIZE_REFUSALS:
            return EventTooLargeError(
                f"Kafka refused the record as too large for topic '{topic}': {error_text(error)}"
            )
        return EventRefusedError(f"Kafka refused the record for topic '{topic}': {error_text(error)}")

    def settled(self, confirmed: int) -> None:
        """The slot is confirmed up to ``confirmed``: past every refused record, each of them is in Kafka
        or dead-lettered, and the hot path goes back to not asking."""
        if confirmed > self._until:
            self._refusals.clear()
            self._culprits.clear()
            self.active = False

    def cleared(self, digest: bytes) -> None:
        """A suspect that Kafka took: it was only refused for its batch-mates."""
        if digest not in self._culprits:
            self._refusals.pop(digest, None)

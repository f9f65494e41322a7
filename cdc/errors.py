"""The one exception tree of outbox CDC.

Every error the library raises on purpose is a :class:`CdcError`. Library errors (psycopg, confluent-kafka,
fastavro) are wrapped at the stage boundary with ``raise ... from exc``, so ``__cause__`` keeps the original
and ``lsn`` says where in the WAL the pipeline was when it happened.

The exit codes follow one rule, for supervisors (systemd's ``RestartPreventExitStatus=2``, Kubernetes):
**exit 2 only when a restart cannot help** (a setting, a right, a slot or publication that must be made, a
refusal an operator must answer); everything an outage causes (Kafka or PostgreSQL unreachable, at the
start or while running, a delivery that timed out) exits 1, and the restart goes on from the slot.
docs/design.md ("Exit codes") has the table of causes.

```
CdcError                          exit 1 unless a subclass says otherwise
├── ConfigError                   exit 2: a setting is missing, unknown or invalid (names the key and the fix)
├── StartupRefusal                exit 2: the environment is not fit to stream, and a restart would not make
│                                 it so (an operator must act); nothing was changed
│   ├── WalLevelError             wal_level is not 'logical'
│   ├── SlotMissingError          the replication slot does not exist (never re-created silently)
│   ├── SlotInvalidatedError      Postgres invalidated the slot (wal_status = 'lost')
│   ├── SlotActiveError           another process is streaming from the slot
│   ├── PublicationError          the publication is missing or does not cover the outbox table
│   ├── RecoveryUnfinishedError   a `cdc recover` of the slot did not finish: run it again
│   └── PartitionerChangeError    the slot published with another partitioner: confirm the switch
├── AccessDeniedError             exit 2: a server refused who we are (TLS, password, SASL) or what we may do
│                                 (an ACL), at the start or while running; names the setting or the right
├── SourceError                   the replication stream (PostgreSQL side)
│   ├── SourceConnectionError     the connection was lost or refused: retried with backoff
│   └── ProtocolError             bytes that are not valid pgoutput / replication protocol
├── EventError                    one event cannot be published as it is: it goes to the dead-letter topic
│   ├── MalformedEventError       a required column is null or has the wrong shape
│   ├── SchemaNotFoundError       no schema for this event_type / schema_version
│   ├── PayloadInvalidError       the payload does not fit its schema (or is not JSON)
│   ├── SchemaRejectedError       the schema registry refused the event's schema (incompatible, invalid)
│   ├── InvalidTopicError         the event's aggregate / event type makes no legal Kafka topic name
│   │   └── ReservedTopicError    ... or names a topic the pipeline owns (dead letters, checkpoints, Kafka's)
│   ├── AggregateTypeNotAllowedError  the aggregate type is not in the aggregate_types allow-list
│   ├── EventTooLargeError        the record is above the producer's message.max.bytes or the topic's limit
│   └── EventRefusedError         Kafka refused the record itself (INVALID_RECORD, INVALID_TIMESTAMP)
├── SinkError                     the Kafka side
│   ├── BrokerUnreachableError    exit 1: Kafka did not answer within the start-up wait (an outage: restart)
│   ├── TopicMissingError         the topic does not exist and may not be created
│   ├── RegistryUnavailableError  the schema registry does not answer or fails: events wait, with backoff
│   └── DeliveryError             Kafka reported a fatal or timed-out delivery: the pipeline stops
│       ├── DeliveryRefusedError  Kafka refused records: the pipeline replays and dead-letters the culprit
│       ├── TransactionAbortedError   exactly-once: a Kafka transaction could not commit, was aborted; restart
│       └── ProducerFencedError   exactly-once: another process took the transactional id: exit 1
├── RecoveryError                 `cdc recover` or `cdc outbox republish` did not finish (no new slot is left)
│   └── RecoveryRefusedError      exit 2: nothing to recover, a pipeline streams, or rows were pruned past it
├── AuditError                    `cdc audit` could not read the table or a topic to the end
│   └── AuditRefusedError         exit 2: the window reaches past what the table, the topics or the slot hold
├── DeadLetterFloodError          exit 1: max_dead_letters within dead_letter_window stopped `cdc run`
├── SchemaCompatibilityError      exit 1: `cdc schemas check` found versions that break the configured mode
├── DeadLetterError               `cdc dlq`: the dead-letter topic cannot be read, or no such record
├── DeserializationError          the consumer side: a value that cannot be decoded to an event
├── ConsumerError                 cdc.consumer: the consumer cannot go on; a restart re-reads what it left
│   ├── RetryableError            raised by a handler: transient; rolled back, retried with bounded backoff
│   ├── PermanentError            raised by a handler: never processable; to the service's dead-letter topic
│   └── RetriesExhaustedError     a RetryableError outlasted the retry policy: the consumer stops, unacked
└── CheckpointError               the acknowledgement bookkeeping was asked something impossible
    └── HistoryDivergedError      exactly-once: the checkpoint's last transaction is not in this server's WAL
                                  (a restored snapshot): the stream restarts from the slot, skipping nothing
```
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "AggregateTypeNotAllowedError",
    "AuditError",
    "AuditRefusedError",
    "BrokerUnreachableError",
    "CdcError",
    "CheckpointError",
    "ConfigError",
    "ConsumerError",
    "DeadLetterError",
    "DeadLetterFloodError",
    "DeliveryError",
    "DeliveryRefusedError",
    "ProducerFencedError",
    "TransactionAbortedError",
    "DeserializationError",
    "EventError",
    "EventRefusedError",
    "EventTooLargeError",
    "InvalidTopicError",
    "MalformedEventError",
    "PayloadInvalidError",
    "PermanentError",
    "PartitionerChangeError",
    "ProtocolError",
    "PublicationError",
    "RecoveryError",
    "RecoveryRefusedError",
    "RecoveryUnfinishedError",
    "RegistryUnavailableError",
    "ReservedTopicError",
    "RetriesExhaustedError",
    "RetryableError",
    "SchemaCompatibilityError",
    "SchemaNotFoundError",
    "SchemaRejectedError",
    "SinkError",
    "SlotActiveError",
    "SlotInvalidatedError",
    "SlotMissingError",
    "SourceConnectionError",
    "SourceError",
    "StartupRefusal",
    "TopicMissingError",
    "WalLevelError",
    "HistoryDivergedError",
]


class CdcError(Exception):
    """Base of every error outbox CDC raises on purpose.

    ``lsn`` is the WAL position the pipeline was at (an int, or None when it does not apply).
    ``exit_code`` is what the CLI exits with when this error ends the process.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, lsn: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.lsn = lsn

    def __str__(self) -> str:
        if self.lsn is None:
            return self.message
        return f"{self.message} (at LSN {format_lsn(self.lsn)})"


class ConfigError(CdcError):
    """A setting is missing, unknown or invalid. ``key`` names it."""

    exit_code = 2

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class StartupRefusal(CdcError):
    """The environment is not fit to stream, and a restart would not make it so: a setting of the server, a
    missing slot or publication, another pipeline on the slot, a decision to confirm. Raised before anything
    is read or confirmed. An outage is never one (it exits 1: :class:`BrokerUnreachableError`,
    :class:`SourceConnectionError`)."""

    exit_code = 2


class WalLevelError(StartupRefusal):
    pass


class SlotMissingError(StartupRefusal):
    pass


class SlotInvalidatedError(StartupRefusal):
    pass


class SlotActiveError(StartupRefusal):
    """Another process streams from the slot; ``pid`` is its walsender's, when known."""

    def __init__(self, message: str, *, pid: int | None = None, lsn: int | None = None) -> None:
        super().__init__(message, lsn=lsn)
        self.pid = pid


class PublicationError(StartupRefusal):
    pass


class AccessDeniedError(CdcError):
    """PostgreSQL, Kafka or the schema registry refused the pipeline's identity or a right it needs. ``key``
    names the setting to fix, ``right`` the grant that is missing (``"Write on Topic:orders"``); nothing past
    it is confirmed. Not retried: a restart meets it again until the setting or the grant is fixed."""

    exit_code = 2

    def __init__(
        self, message: str, *, key: str | None = None, right: str | None = None, lsn: int | None = None
    ) -> None:
        super().__init__(message, lsn=lsn)
        self.key = key
        self.right = right


class RecoveryUnfinishedError(StartupRefusal):
    """`cdc recover` re-created the slot but did not finish republishing from the outbox table: streaming
    from that slot now would skip what the lost one had not delivered."""


class PartitionerChangeError(StartupRefusal):
    """The slot's events were published with another partitioner; switching moves keys to other
    partitions (``cdc run --accept-partitioner-change`` confirms it)."""


class SourceError(CdcError):
    pass


class SourceConnectionError(SourceError):
    """The replication connection was lost or refused. The pipeline retries it with backoff."""


class ProtocolError(SourceError):
    """Bytes that do not parse as the replication or pgoutput protocol."""


class EventError(CdcError):
    """One event cannot be published as it is. ``reason`` is a short machine-readable word for the DLQ."""

    reason: str = "invalid_event"


class MalformedEventError(EventError):
    reason = "malformed_event"


class SchemaNotFoundError(EventError):
    reason = "schema_not_found"


class PayloadInvalidError(EventError):
    reason = "payload_invalid"


class SchemaRejectedError(EventError):
    reason = "schema_rejected"


class EventTooLargeError(EventError):
    reason = "too_large"


class EventRefusedError(EventError):
    """The broker refused the record itself (not its size): an invalid record for the topic's settings, or
    a timestamp outside what the topic accepts. Found by producing the suspects one by one."""

    reason = "refused_by_kafka"


class InvalidTopicError(EventError):
    reason = "invalid_topic"


class ReservedTopicError(InvalidTopicError):
    """The event's names make the name of a topic the pipeline writes for itself (the dead-letter or the
    checkpoint topic) or of one of Kafka's internal topics: a row must never write into those."""

    reason = "reserved_topic"


class AggregateTypeNotAllowedError(EventError):
    reason = "aggregate_type_not_allowed"


class SinkError(CdcError):
    pass


class BrokerUnreachableError(SinkError):
    """Kafka did not answer within ``startup_timeout`` (metadata, ``init_transactions``). An outage, not a
    refusal: exit 1, so that the supervisor's restart waits for it again (a wrong address looks the same,
    and the restarts' lines say it; an address, a certificate or a password Kafka refuses is an
    :class:`AccessDeniedError`)."""


class TopicMissingError(SinkError):
    pass


class RegistryUnavailableError(SinkError):
    """Infrastructure, never the event's fault: the event waits with backoff, it is not dead-lettered."""


class DeliveryError(SinkError):
    pass


class DeliveryRefusedError(DeliveryError):
    """Kafka refused records (too large, invalid) and the producer stopped so that nothing is appended
    behind them. The pipeline does not exit: it replays from the slot, produces the refused records one by
    one, and dead-letters the one Kafka refuses alone. ``refused`` holds (record digest, error) pairs."""

    def __init__(self, message: str, *, refused: list[tuple[bytes, object]], lsn: int | None = None) -> None:
        super().__init__(message, lsn=lsn)
        self.refused = refused


class TransactionAbortedError(DeliveryError):
    """Exactly-once: the Kafka transaction could not commit and was aborted; the stream restarts from the
    slot and skips what the last committed checkpoint covers."""


class ProducerFencedError(DeliveryError):
    """Exactly-once: another process initialised the same transactional id; this one publishes nothing
    more."""


class RecoveryError(CdcError):
    """`cdc recover` or `cdc outbox republish` could not finish. A recover leaves no usable slot behind."""


class RecoveryRefusedError(RecoveryError):
    """`cdc recover` will not run: the slot needs no recovery, a pipeline streams from it, or the outbox
    table no longer holds every row it would need. Nothing was changed."""

    exit_code = 2


class AuditError(CdcError):
    """`cdc audit` could not finish: the table or a topic could not be read (to its end, in time). Its verdict
    is unknown, which is not "nothing missing"."""


class AuditRefusedError(AuditError):
    """`cdc audit` will not judge this window: rows were pruned from it, retention deleted records of it, or
    it ends where events may still be in flight. The message says which bound to move."""

    exit_code = 2


class DeadLetterFloodError(CdcError):
    """The poison-flood brake: ``max_dead_letters`` dead letters within ``dead_letter_window`` seconds. The
    pipeline finished the source transaction of the last one, waited for Kafka's acknowledgements and
    confirmed them to the slot, like at SIGTERM, then exits 1: a restart goes on from there, and meets the
    flood again if it goes on, which the supervisor's restart count and the metrics make visible."""


class SchemaCompatibilityError(CdcError):
    pass


class DeadLetterError(CdcError):
    pass


class DeserializationError(CdcError):
    pass


class ConsumerError(CdcError):
    """The consumer helper cannot go on. Nothing past the failing record was acknowledged to Kafka."""


class RetryableError(ConsumerError):
    """Raise from a handler for a transient failure (a service that is briefly down, a lock timeout): the
    transaction is rolled back and the record retried with exponential backoff, a bounded number of times."""


class PermanentError(ConsumerError):
    """Raise from a handler when the event can never be processed (it breaks a business rule, it refers to
    something that does not exist): the record goes to the service's dead-letter topic with ``reason`` and
    the message, and the partition moves on. Keep payload values out of the message: it becomes a header."""

    def __init__(self, message: str, *, reason: str = "rejected") -> None:
        super().__init__(message)
        self.reason = reason


class RetriesExhaustedError(ConsumerError):
    """A RetryableError was still raised after the last attempt the retry policy allows."""


class CheckpointError(CdcError):
    pass


class HistoryDivergedError(CheckpointError):
    """Exactly-once: the server's WAL passed the checkpoint without the checkpoint's own transaction (its
    end LSN, xid and commit time): the server is a restored copy, and its transactions below the checkpoint
    are new. Never ends the run: the stream restarts from the slot and skips nothing below that checkpoint."""


def first_line(exc: BaseException) -> str:
    """The first line of a library error: psycopg's messages carry hints and context on later lines; the
    first names the problem (and never the password)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def format_lsn(lsn: int) -> str:
    """Render an LSN the way PostgreSQL does: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """Parse PostgreSQL's ``XXX/XXX`` LSN notation."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)

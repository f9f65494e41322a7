"""Settings of outbox CDC: defaults < TOML file < ``CDC_*`` environment < overrides (flags).

Choices made here (docs/design.md has the table of every setting):

- Environment: every scalar top-level key ``k`` is read from ``CDC_<K>`` (``CDC_STATUS_INTERVAL``...), plus
  ``CDC_KAFKA_BOOTSTRAP_SERVERS``, ``CDC_COLUMNS`` (a preset name) and ``CDC_CONFIG`` (the TOML file).
  ``CDC_KAFKA_<KEY>`` sets the librdkafka key ``<key>`` (lower case, ``_`` as ``.``). An empty variable
  counts as not set. An unknown ``CDC_*`` name is refused with a did-you-mean, except the tooling's own
  ``CDC_STACK_*``, ``CDC_FAULTS_*`` and ``CDC_COMPOSE_*``; ``Settings.sources`` says where each non-default
  value came from, for ``cdc config show``.
- ``topic_partitions`` defaults to 3, so that per-aggregate ordering still leaves room to scale consumers.
- ``kafka.<key>`` passes librdkafka producer keys through; the pipeline owns idempotence, ``acks=all``, the
  delivery timeout (``delivery_timeout``) and the bootstrap servers (``kafka.bootstrap_servers``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc.errors import ConfigError

__all__ = [
    "MODES",
    "ColumnMap",
    "KafkaSettings",
    "Settings",
    "TRACING_MODES",
    "TableRef",
    "created_at_missing",
    "describe_dsn",
    "redact_dsn",
]

REDACTED = "***"
# The schema compatibility modes (cdc.avro.compat checks them): the registry's names.
MODES = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
# PostgreSQL also takes `$` in unquoted names, but `cdc setup` puts the names inside `$$`-quoted bodies, where
# a `$$` would end the body early: such a name is refused rather than risked.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SECRET_KEY_PARTS = ("password", "secret", "sasl.oauthbearer.config", "key.pem", "private.key")
_PLACEHOLDERS = ("aggregate_type", "event_type")
# Which partition a key lands on: murmur2_random is the Java producer's mapping (murmur2 of the key bytes),
# consistent_random librdkafka's own default (CRC32), which the pipeline used before it chose Java's.
PARTITIONERS = ("murmur2_random", "consistent_random")
# Spans of `cdc run` (cdc.tracing): for the rows that carry a trace context, for every event, or none.
TRACING_MODES = ("row-context-only", "always", "off")
_CHOICES = {
    "value_format": ("single-object", "confluent"),
    "schema_compatibility": MODES,
    "subject_name_strategy": ("topic_record", "topic", "record"),
    "on_invalid_event": ("dlq", "stop"),
    "on_slot_active": ("refuse", "wait"),
    "partitioner": PARTITIONERS,
    "delivery": ("at-least-once", "exactly-once"),
    "log_format": ("text", "json"),
    "fast_path": ("auto", "off", "required"),
    "tracing": TRACING_MODES,
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
}
# delivery_timeout becomes librdkafka's message.timeout.ms, whose 0 means "never": a value that rounds to it
# would turn a broker outage into a wait without end.
# Exactly-once: librdkafka's transaction.timeout.ms unless kafka.transaction.timeout.ms says otherwise. A
# transaction may hold a source transaction of a million rows, through a broker restart: librdkafka's 60 s
# default would abort it, and every replay of it, under load. The broker's transaction.max.timeout.ms (15
# minutes by default) must not be lower.
TRANSACTION_TIMEOUT_MS = 300_000
# Exactly-once: how old a Kafka transaction may grow while the pipeline drains a backlog (its records are late
# by the backlog anyway, and every commit pauses the reading), when transaction_max_seconds is shorter.
DRAIN_TRANSACTION_SECONDS = 1.0

_MIN_SECONDS = {
    "delivery_timeout": 1.0,
    "source_silence_timeout": 3.0,  # a third of it is when a reply is asked for: above the read loop's wait
    "query_timeout": 1.0,
    "liveness_timeout": 10.0,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TableRef:
    schema: str = "public"
    name: str = "outbox"

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ColumnMap:
    """Logical outbox field -> column name. ``None`` = no such column (schema_version then counts as 1)."""

    id: str = "id"
    aggregate_type: str = "aggregate_type"
    aggregate_id: str = "aggregate_id"
    event_type: str = "event_type"
    payload: str = "payload"
    schema_version: str | None = "schema_version"
    headers: str | None = "headers"
    created_at: str | None = "created_at"
    # Debezium's tracing column: Java Properties text whose traceparent and tracestate become headers. Read
    # only when the table has it and the headers column is not mapped (cdc.stream.route).
    tracing_span_context: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PRESETS: Mapping[str, ColumnMap] = MappingProxyType(
    {
        "default": ColumnMap(),
        "debezium": ColumnMap(
            aggregate_type="aggregatetype",
            aggregate_id="aggregateid",
            event_type="type",
            schema_version=None,
            headers=None,
            created_at=None,
            tracing_span_context="tracingspancontext",
        ),
    }
)
_OPTIONAL_COLUMNS = ("schema_version", "headers", "created_at", "tracing_span_context")


@dataclass(frozen=True, kw_only=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "localhost:9092"
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def redacted(self) -> dict[str, object]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            **{k: REDACTED if is_secret(k) else v for k, v in self.extra.items()},
        }

    def __repr__(self) -> str:
        return f"KafkaSettings({self.redacted()!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    database_url: str
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    # The password, read at every (re)connect (cdc.pg.database_dsn): a file's content, or a command's output.
    database_password_file: str | None = None
    database_password_command: str | None = None
    # Kafka's SASL password, from a file read at every new client and again when the broker refuses it.
    kafka_sasl_password_file: str | None = None
    slot: str = "cdc_outbox"
    publication: str = "cdc_outbox"
    table: TableRef = field(default_factory=TableRef)
    columns: ColumnMap = field(default_factory=ColumnMap)
    schemas_dir: Path = Path("schemas")
    topic_template: str = "outbox.event.{aggregate_type}"
    aggregate_types: tuple[str, ...] | None = None  # an allow-list; None: any
    dlq_topic: str = "outbox.dlq"
    value_format: str = "single-object"
    schema_registry_url: str | None = None
    # The CA bundle (PEM) that an https:// registry's certificate must chain to; None: the system's.
    schema_registry_ca_file: str | None = None
    schema_compatibility: str = "BACKWARD"
    subject_name_strategy: str = "topic_record"
    topic_partitions: int = 3
    partitioner: str = "murmur2_random"  # Java's; PARTITIONERS
    # None: the brokers' own default.replication.factor (CreateTopics with -1), never a silent 1.
    topic_replication_factor: int | None = None
    create_topics: bool = True
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    status_interval: float = 10.0
    shutdown_timeout: float = 30.0
    delivery_timeout: float = 120.0
    startup_timeout: float = 30.0
    # Silence: nothing from PostgreSQL's replication stream for this long is a dead connection (a reply is
    # asked for after a third of it); every other PostgreSQL wait ends after query_timeout; /healthz fails
    # when the stream's loop has not turned for liveness_timeout (cdc.pg, cdc.stream.source).
    source_silence_timeout: float = 30.0
    query_timeout: float = 30.0
    liveness_timeout: float = 120.0
    backoff_initial: float = 0.5
    backoff_multiplier: float = 2.0
    backoff_max: float = 30.0
    # Records handed to the producer and not yet acknowledged. Each costs about 1 KB of memory beyond its
    # bytes (librdkafka's message and headers, the Python callback): 100,000 made 96-162 MB peaks in
    # make bench, and 20,000 is three times what 200,000 events/s need at a 30 ms acknowledgement.
    max_in_flight: int = 20_000
    # ... and at most this many MiB of them (librdkafka's queue.buffering.max.kbytes): the producer queue is
    # most of the pipeline's memory when Kafka lags, and reading pauses while it is full.
    max_in_flight_mb: int = 32
    heartbeat_interval: float = 30.0
    on_invalid_event: str = "dlq"
    # The poison-flood brake: this many dead letters within dead_letter_window seconds stop `cdc run` (exit 1)
    # once the source transaction of the last one is whole and confirmed. None: off.
    max_dead_letters: int | None = None
    dead_letter_window: float = 60.0
    on_slot_active: str = "refuse"  # "wait": a standby that takes over when the slot is released
    # "exactly-once": Kafka transactions with the checkpoint inside (cdc.stream.transactions).
    delivery: str = "at-least-once"
    # None: outbox-cdc.<PostgreSQL's system identifier>.<slot> (cdc.stream.transactions).
    transactional_id: str | None = None
    checkpoint_topic: str = "outbox.cdc.checkpoints"
    transaction_max_events: int = 200_000
    transaction_max_seconds: float = 0.1
    log_level: str = "INFO"
    log_format: str = "text"
    fast_path: str = "auto"  # the compiled hot path: when built, "off" or "required" (cdc.fastpath)
    tracing: str = "row-context-only"  # TRACING_MODES; OpenTelemetry's own OTEL_* variables do the rest
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def redacted(self) -> dict[str, object]:
        """The effective settings as plain data, with every secret replaced by ``***``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in out.items():
            if key in ("database_url", "schema_registry_url") and value is not None:
                out[key] = redact_dsn(value)
            elif isinstance(value, KafkaSettings):
                out[key] = value.redacted()
            elif isinstance(value, ColumnMap | Mapping):
                out[key] = value.as_dict() if isinstance(value, ColumnMap) else dict(value)
            elif isinstance(value, Path | TableRef):
                out[key] = str(value)
        return out

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.redacted().items() if k != "sources")
        return f"Settings({items})"


def created_at_missing(settings: Settings, needed_by: str, otherwise: str = "") -> ConfigError:
    """The refusal of a command that chooses rows by creation time when ``columns`` maps no such column (the
    debezium preset has none), with the two steps that give it one (docs/operations.md, "Moving from
    Debezium")."""
    preset = next(
        (n for n, p in PRESETS.items() if p.as_dict() | {"created_at": None} == settings.columns.as_dict()),
        None,
    )
    mapping = (
        f'columns = {{ preset = "{preset}", created_at = "created_at" }}'
        if preset
        else 'columns.created_at = "created_at"'
    )
    return ConfigError(
        f"{needed_by} needs the outbox's creation-time column, and 'columns' maps none"
        f"{' (the ' + preset + ' preset has none)' if preset else ''}. Add one with a default, so that the "
        f"applications' inserts stay as they are: ALTER TABLE {settings.table} ADD COLUMN created_at "
        f'timestamptz NOT NULL DEFAULT now(); then map it: {mapping} (docs/operations.md, "Moving from '
        f'Debezium"){otherwise}',
        key="columns.created_at",
    )


def is_secret(key: str) -> bool:
    return any(part in key.lower() for part in _SECRET_KEY_PARTS)


def redact_dsn(dsn: str) -> str:
    """``dsn`` (libpq URI or conninfo, or any URL) with only its password(s) replaced by ``***``.

    A URI's userinfo ends at the last '@' before the first '/', else (a raw '/' or '?' in the password) at
    the last '@' of all: in doubt this redacts too much, never too little.
    """
    if "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        at = rest.rfind("@", 0, rest.find("/") % (len(rest) + 1))
        at = rest.rfind("@") if at < 0 else at
        if at >= 0 and ":" in rest[:at]:
            rest = f"{rest[:at].split(':', 1)[0]}:{REDACTED}{rest[at:]}"
        return re.sub(r"([?&](?:ssl)?password=)[^&#]*", rf"\1{REDACTED}", f"{scheme}://{rest}")
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # What follows a password cannot be told apart from it when the string does not parse.
        return f"{REDACTED} (a connection string that does not parse)"
    return re.sub(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", rf"\1{REDACTED}", dsn)


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` for logs; missing parts are left out (host: localhost, port: 5432)."""
    parts: dict[str, str] = {}
    if "://" in dsn:
        url = urlsplit(dsn)
        userinfo, _, hosts = url.netloc.rpartition("@")
        parts["user"] = unquote(userinfo.split(":", 1)[0])
        host, _, port = re.sub(r"^\[(.*)\]", r"\1", hosts.split(",", 1)[0]).rpartition(":")
        host, port = (host, port) if host and port.isdigit() else (f"{host}:{port}".strip(":"), "")
        parts.update(host=unquote(host), port=port, dbname=unquote(url.path[1:]))
        parts.update((k, v) for k, v in parse_qsl(url.query) if k in ("user", "host", "port", "dbname"))
    else:
        pairs = re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", dsn)
        parts.update((k, v.strip("'")) for k, v in pairs if k in ("user", "host", "port", "dbname"))
    user = parts.get("user") or ""
    host = (parts.get("host") or "localhost").split(",")[0]
    port = (parts.get("port") or "5432").split(",")[0]
    return f"{user + '@' if user else ''}{host}:{port}/{parts.get('dbname') or user}"

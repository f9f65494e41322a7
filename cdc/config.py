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

import difflib
import logging
import math
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
from confluent_kafka import KafkaException, Producer
from psycopg.conninfo import conninfo_to_dict

from cdc.compat import MODES
from cdc.errors import ConfigError

__all__ = [
    "ColumnMap",
    "KafkaSettings",
    "Settings",
    "TableRef",
    "describe_dsn",
    "load_settings",
    "redact_dsn",
    "validate_kafka_config",
]

REDACTED = "***"
# PostgreSQL also takes `$` in unquoted names, but `cdc setup` puts the names inside `$$`-quoted bodies, where
# a `$$` would end the body early: such a name is refused rather than risked.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SECRET_KEY_PARTS = ("password", "secret", "sasl.oauthbearer.config", "key.pem", "private.key")
_PLACEHOLDERS = ("aggregate_type", "event_type")
_CHOICES = {
    "value_format": ("single-object", "confluent"),
    "schema_compatibility": MODES,
    "subject_name_strategy": ("topic_record", "topic", "record"),
    "on_invalid_event": ("dlq", "stop"),
    "log_format": ("text", "json"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
}
_OWNED = {
    "enable.idempotence": ("true",),
    "acks": ("all", "-1"),
    "request.required.acks": ("all", "-1"),
    # cdc.sink.FIXED_PRODUCER_CONFIG says why: more than one in flight can lose acknowledged records.
    "max.in.flight.requests.per.connection": ("1",),
    "max.in.flight": ("1",),
    # Nothing appended behind a refused record: cdc.refusals relies on it to keep each key in order.
    "enable.gapless.guarantee": ("true",),
}
# delivery_timeout becomes librdkafka's message.timeout.ms, whose 0 means "never": a value that rounds to it
# would turn a broker outage into a wait without end.
_MIN_SECONDS = {"delivery_timeout": 1.0}
_RESERVED = {
    "bootstrap.servers": "set kafka.bootstrap_servers instead",
    "delivery.timeout.ms": "set delivery_timeout (seconds) instead",
    "message.timeout.ms": "set delivery_timeout (seconds) instead",
    "transactional.id": "exactly-once mode is not supported yet",
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
        ),
    }
)
_OPTIONAL_COLUMNS = ("schema_version", "headers", "created_at")


@dataclass(frozen=True, kw_only=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "localhost:9092"
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def redacted(self) -> dict[str, object]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            **{k: REDACTED if _is_secret(k) else v for k, v in self.extra.items()},
        }

    def __repr__(self) -> str:
        return f"KafkaSettings({self.redacted()!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    database_url: str
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
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
    schema_compatibility: str = "BACKWARD"
    subject_name_strategy: str = "topic_record"
    topic_partitions: int = 3
    topic_replication_factor: int = 1
    create_topics: bool = True
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    status_interval: float = 10.0
    shutdown_timeout: float = 30.0
    delivery_timeout: float = 120.0
    startup_timeout: float = 30.0
    backoff_initial: float = 0.5
    backoff_multiplier: float = 2.0
    backoff_max: float = 30.0
    max_in_flight: int = 100_000
    heartbeat_interval: float = 30.0
    on_invalid_event: str = "dlq"
    log_level: str = "INFO"
    log_format: str = "text"
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


def _is_secret(key: str) -> bool:
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


def validate_kafka_config(conf: dict[str, str]) -> None:
    """Check the user's librdkafka producer keys (``kafka.<key>``, without bootstrap servers).

    Builds and drops a Producer that has no broker to connect to: it returns at once and leaves no thread.
    """
    for key, value in conf.items():
        allowed, fix = _OWNED.get(key), _RESERVED.get(key)
        if allowed is not None and value.strip().lower() not in allowed:
            fix = f"{value!r} would weaken delivery guarantees; the pipeline requires {key}={allowed[0]}"
        if fix:
            raise ConfigError(f"setting 'kafka.{key}' is owned by the pipeline: {fix}", key=f"kafka.{key}")
    error = _producer_error(conf) if conf else None
    if error is None:
        return
    for value in (v for k, v in conf.items() if _is_secret(k) and v):
        error = error.replace(value, REDACTED)
    named = [n for n in re.findall(r"[\"`]([\w.]+)[\"`]", error) if n in conf]
    culprit = named[0] if named else next((k for k in conf if _producer_error({k: conf[k]})), None)
    key = f"kafka.{culprit}" if culprit else "kafka"
    raise ConfigError(
        f"setting '{key}' is not accepted by librdkafka: {error} (see librdkafka's "
        "CONFIGURATION.md for the producer properties and their values)",
        key=key,
    )


_QUIET = logging.Logger("cdc.config.validate", logging.CRITICAL + 1)  # a detached logger that drops all


def _producer_error(user: dict[str, str]) -> str | None:
    try:
        producer = Producer({**user, "enable.idempotence": "true", "acks": "all", "logger": _QUIET})
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        return str(err.str()) if hasattr(err, "str") else str(err)
    except (TypeError, ValueError) as exc:
        return str(exc)
    producer.flush(0)  # nothing queued: returns at once; the producer is destroyed when it goes out of scope
    return None


_KINDS: dict[str, str] = {f.name: str(f.type) for f in fields(Settings) if f.name not in ("kafka", "sources")}
_TOP_KEYS = (*_KINDS, "kafka")
_ENV = {**{f"CDC_{k.upper()}": k for k in _KINDS}, "CDC_KAFKA_BOOTSTRAP_SERVERS": "kafka.bootstrap_servers"}
# Variables of the project's own tooling (the local stack, the fault suite, docker compose): not settings.
_TOOLING_ENV = ("CDC_STACK_", "CDC_FAULTS_", "CDC_COMPOSE_")


def load_settings(
    *,
    config_file: Path | None,
    environ: Mapping[str, str],
    overrides: Mapping[str, object],
    require_database: bool = True,
) -> Settings:
    """Merge defaults < TOML file < ``CDC_*`` environment < overrides, validate, and build Settings.

    ``require_database=False`` is for commands that never connect to PostgreSQL (``cdc schemas``, ``cdc
    dlq``): ``database_url`` may then be missing, and is empty."""
    merged: dict[str, tuple[object, str]] = {}
    if config_file is None and environ.get("CDC_CONFIG"):
        config_file = Path(environ["CDC_CONFIG"])
    if config_file is not None:
        try:
            data: dict[str, Any] = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}", key="config") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {config_file} is not UTF-8 text (byte {exc.start}): save it as UTF-8",
                key="config",
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}", key="config") from exc
        merged.update((k, (v, f"in {config_file}")) for k, v in _flatten(data, f"in {config_file}").items())
    merged.update(_environment(environ))
    given = _flatten({k: v for k, v in overrides.items() if v is not None}, "in the overrides")
    merged.update((k, (v, "from the overrides")) for k, v in given.items())
    if "database_url" not in merged and not require_database:
        merged["database_url"] = ("", "not needed by this command")
    if "database_url" not in merged:
        raise ConfigError(
            "setting 'database_url' is required: set CDC_DATABASE_URL or database_url in the config file",
            key="database_url",
        )
    kwargs = {k: _coerce(k, v, f" ({src})") for k, (v, src) in merged.items() if not k.startswith("kafka.")}
    sources = MappingProxyType({k: w for k, (_, w) in merged.items()})
    settings = Settings(kafka=_kafka(merged), sources=sources, **kwargs)  # type: ignore[arg-type]
    _check(settings, merged, require_database)
    return settings


def _environment(environ: Mapping[str, str]) -> dict[str, tuple[object, str]]:
    """The settings given as ``CDC_*`` variables. ``CDC_KAFKA_<KEY>`` is the librdkafka setting ``<key>`` in
    lower case with ``_`` as ``.`` (``CDC_KAFKA_SASL_PASSWORD`` -> ``kafka.sasl.password``). Any other
    ``CDC_*`` name is a typo until proven otherwise, and refused: a misspelt ``CDC_ON_INVALID_EVENT`` would
    otherwise leave the default quietly in force. The project's own tooling variables are not settings."""
    out: dict[str, tuple[object, str]] = {}
    for name, value in environ.items():
        if not name.startswith("CDC_") or name.startswith(_TOOLING_ENV) or name == "CDC_CONFIG":
            continue
        if name in _ENV:
            key = _ENV[name]
        elif name.startswith("CDC_KAFKA_") and len(name) > len("CDC_KAFKA_"):
            key = "kafka." + name[len("CDC_KAFKA_") :].lower().replace("_", ".")
        else:
            hint = difflib.get_close_matches(name, [*_ENV, "CDC_CONFIG"], n=1)
            raise ConfigError(
                f"unknown environment variable {name}: no setting of outbox CDC is named so"
                + (f"; did you mean {hint[0]}?" if hint else "")
                + " (librdkafka settings go in CDC_KAFKA_<KEY>, e.g. CDC_KAFKA_SECURITY_PROTOCOL)",
                key=name,
            )
        if value != "":  # an empty variable counts as not set
            out[key] = (value, f"from {name}")
    return out


def _flatten(data: Mapping[str, Any], where: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        top = key.split(".", 1)[0]
        if top not in _TOP_KEYS or (top != "kafka" and "." in key):
            hint = difflib.get_close_matches(key, _TOP_KEYS, n=1)
            raise ConfigError(
                f"unknown setting {key!r} {where}" + (f"; did you mean {hint[0]!r}?" if hint else ""), key=key
            )
        if key == "kafka" and not isinstance(value, Mapping):
            raise _fail(key, f" ({where})", "a table of librdkafka producer settings", value)
        if isinstance(value, Mapping) and key != "columns":
            out.update(_flatten({f"{key}.{k}": v for k, v in value.items()}, where))
        else:
            out[key] = value
    return out


def _fail(key: str, where: str, must: str, value: object) -> ConfigError:
    return ConfigError(f"setting {key!r}{where} must be {must}, got {value!r}", key=key)


def _coerce(key: str, value: object, where: str) -> object:
    kind = _KINDS[key]
    if "None" in kind and isinstance(value, str) and value.strip().lower() in ("", "off", "none"):
        return None
    if kind.startswith("float"):
        factor = key == "backoff_multiplier"
        try:
            number = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise _fail(key, where, "a number" if factor else "a number of seconds", value)
        if number < 1 if factor else number <= 0:
            raise _fail(key, where, "at least 1" if factor else "more than 0 seconds", value)
        if key in _MIN_SECONDS and number < _MIN_SECONDS[key]:
            raise _fail(key, where, f"at least {_MIN_SECONDS[key]:g} second(s)", value)
        return number
    if kind.startswith("int"):
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            value = int(value)
        low, high = (1, 65535) if key == "metrics_port" else (1, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
            raise _fail(key, where, "a port number (1-65535)" if high else "a whole number >= 1", value)
        return value
    if kind.startswith("tuple"):
        items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
        if (
            not isinstance(items, list | tuple)
            or not items
            or not all(isinstance(v, str) and v for v in items)
        ):
            raise _fail(key, where, "a non-empty list of names (in the environment: comma-separated)", value)
        return tuple(items)
    if kind == "bool":
        text = str(value).strip().lower()
        if isinstance(value, bool) or text in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value if isinstance(value, bool) else text in ("true", "1", "yes", "on")
        raise _fail(key, where, "true or false", value)
    if key == "columns":
        return _columns(value, where)
    if not isinstance(value, str | Path):
        raise _fail(key, where, "a string", value)
    text = str(value)
    if key in _CHOICES:
        text = text.upper() if key in ("log_level", "schema_compatibility") else text
        if text not in _CHOICES[key]:
            raise _fail(key, where, "one of " + ", ".join(map(repr, _CHOICES[key])), value)
    if key == "table":
        match = re.fullmatch(rf"(?:({_IDENT.pattern})\.)?({_IDENT.pattern})", text)
        if match is None:
            raise _fail(key, where, "a table name like 'public.outbox' (unquoted identifiers)", value)
        return TableRef(schema=match[1] or "public", name=match[2])
    return Path(text) if key == "schemas_dir" else text


def _columns(value: object, where: str) -> ColumnMap:
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, Mapping):
        raise _fail("columns", where, "a preset name or a table of column names", value)
    mapping = dict(value)
    preset = mapping.pop("preset", "default")
    if preset not in PRESETS:
        raise _fail("columns", where, "a preset among " + ", ".join(map(repr, PRESETS)), preset)
    names: dict[str, Any] = PRESETS[preset].as_dict()
    for logical, column in mapping.items():
        if logical not in names:
            hint = difflib.get_close_matches(str(logical), [*names, "preset"], n=1)
            raise ConfigError(
                f"unknown column field {logical!r}{where}; known: {', '.join(names)}"
                + (f"; did you mean {hint[0]!r}?" if hint else ""),
                key=f"columns.{logical}",
            )
        if column is False and logical in _OPTIONAL_COLUMNS:
            names[logical] = None
        elif isinstance(column, str) and _IDENT.fullmatch(column):
            names[logical] = column
        else:
            optional = " (or false for no such column)" if logical in _OPTIONAL_COLUMNS else ""
            raise _fail(f"columns.{logical}", where, f"a column name{optional}", column)
    used = [c for c in names.values() if c is not None]
    if len(used) != len(set(used)):
        raise ConfigError(f"setting 'columns'{where} maps two fields to one column: {names}", key="columns")
    return replace(PRESETS[preset], **names)


def _kafka(merged: Mapping[str, tuple[object, str]]) -> KafkaSettings:
    servers, extra = "localhost:9092", {}
    for key, (value, where) in merged.items():
        if not key.startswith("kafka."):
            continue
        value = str(value).lower() if isinstance(value, bool) else value
        if not isinstance(value, str | int | float):
            shown = REDACTED if _is_secret(key) else value
            raise _fail(key, f" ({where})", "a string, number or boolean", shown)
        if key == "kafka.bootstrap_servers":
            servers = str(value)
        else:
            extra[key.removeprefix("kafka.")] = str(value)
    if not servers.strip():
        raise _fail("kafka.bootstrap_servers", "", "host:port[,host:port...]", servers)
    validate_kafka_config(extra)
    return KafkaSettings(bootstrap_servers=servers, extra=MappingProxyType(extra))


def _check(s: Settings, merged: Mapping[str, tuple[object, str]], require_database: bool = True) -> None:
    def where(key: str) -> str:
        return f" ({merged[key][1]})" if key in merged else ""

    if require_database and not s.database_url.strip():
        raise ConfigError("setting 'database_url' must not be empty", key="database_url")
    if require_database:
        try:
            conninfo_to_dict(s.database_url)
        except psycopg.ProgrammingError:
            # libpq's message quotes the text around the fault, which may be the password: never shown.
            raise ConfigError(
                f"setting 'database_url'{where('database_url')} is not a connection string libpq can read: "
                "write a URI (postgresql://user@host:5432/dbname) or key=value pairs, quoting a value with "
                "spaces or quotes as password='a b' and percent-encoding such characters in a URI (its "
                "text is not shown: it may hold a password)",
                key="database_url",
            ) from None
    if not re.fullmatch(r"[a-z0-9_]{1,63}", s.slot):
        raise _fail("slot", where("slot"), "lower-case letters, digits and _ (at most 63)", s.slot)
    if not _IDENT.fullmatch(s.publication):
        raise _fail("publication", where("publication"), "an unquoted identifier", s.publication)
    if not _TOPIC.fullmatch(s.dlq_topic):
        raise _fail("dlq_topic", where("dlq_topic"), "a Kafka topic name ([A-Za-z0-9._-])", s.dlq_topic)
    try:
        parsed = list(string.Formatter().parse(s.topic_template))
    except ValueError as exc:
        raise _fail(
            "topic_template", where("topic_template"), f"a valid template ({exc})", s.topic_template
        ) from exc
    for _, name, spec, conversion in parsed:
        if name is not None and (name not in _PLACEHOLDERS or spec or conversion):
            raise ConfigError(
                f"setting 'topic_template'{where('topic_template')} uses unknown placeholder "
                f"{{{name}}}; allowed: {{aggregate_type}}, {{event_type}} (no format specs)",
                key="topic_template",
            )
    if not _TOPIC.fullmatch(s.topic_template.format(aggregate_type="a", event_type="e")):
        raise _fail("topic_template", where("topic_template"), "a Kafka topic name pattern", s.topic_template)
    if s.backoff_max < s.backoff_initial:
        raise _fail("backoff_max", where("backoff_max"), "at least backoff_initial", s.backoff_max)
    registry = s.schema_registry_url
    if s.value_format == "confluent" and registry is None:
        raise ConfigError(
            "setting 'schema_registry_url' is required when value_format = 'confluent': set "
            "CDC_SCHEMA_REGISTRY_URL or schema_registry_url in the config file",
            key="schema_registry_url",
        )
    if registry is not None and not re.match(r"https?://[^/]", registry):
        raise _fail(
            "schema_registry_url", where("schema_registry_url"), "an http(s):// URL", redact_dsn(registry)
        )

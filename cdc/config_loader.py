"""Loading the settings: defaults < TOML file < ``CDC_*`` environment < overrides (flags), each value
checked and converted, an unknown key refused with its name and a did-you-mean.

:func:`load_settings` is re-exported by :mod:`cdc.config`, where the typed :class:`~cdc.config.Settings`
lives; the choices (environment names, presets, owned Kafka keys) are described there.
"""

from __future__ import annotations

import difflib
import math
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from cdc.config import (
    _CHOICES,
    _IDENT,
    _MIN_SECONDS,
    _OPTIONAL_COLUMNS,
    _PLACEHOLDERS,
    _TOPIC,
    DRAIN_TRANSACTION_SECONDS,
    PRESETS,
    REDACTED,
    TRANSACTION_TIMEOUT_MS,
    ColumnMap,
    KafkaSettings,
    Settings,
    TableRef,
    is_secret,
    redact_dsn,
)
from cdc.config_dsn import check_database_url
from cdc.config_kafka import producer_error, validate_kafka_config
from cdc.errors import ConfigError

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
            _refuse_a_near_miss(name, key.removeprefix("kafka."), value)
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


def _refuse_a_near_miss(name: str, librdkafka_key: str, value: str) -> None:
    """``CDC_KAFKA_BOOTSTRAP_SERVER`` is librdkafka's ``bootstrap.server``, which does not exist: the
    variable meant is one of ours, a letter away. Said only when librdkafka has no such property."""
    near = difflib.get_close_matches(name, [n for n in _ENV if n.startswith("CDC_KAFKA_")], n=1, cutoff=0.9)
    if near and "No such configuration property" in (producer_error({librdkafka_key: value}) or ""):
        raise ConfigError(
            f"unknown environment variable {name}: did you mean {near[0]}? (as a CDC_KAFKA_<KEY> variable "
            f"it would be librdkafka's {librdkafka_key!r}, which does not exist)",
            key=name,
        )


def _flatten(data: Mapping[str, Any], where: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        top = key.split(".", 1)[0]
        if top not in _TOP_KEYS or (top != "kafka" and "." in key):
            if key.startswith("kafka_"):  # the environment's spelling, in the file
                rest = key.removeprefix("kafka_")
                inner = rest if rest == "bootstrap_servers" else rest.replace("_", ".")
                hint = f"; did you mean {inner!r} in the [kafka] table ([kafka] {inner} = ...)?"
            else:
                close = difflib.get_close_matches(key, _TOP_KEYS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown setting {key!r} {where}{hint}", key=key)
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
            shown = REDACTED if is_secret(key) else value
            raise _fail(key, f" ({where})", "a string, number or boolean", shown)
        if key == "kafka.bootstrap_servers":
            servers = str(value)
        else:
            extra[key.removeprefix("kafka.")] = str(value)
    if not servers.strip():
        raise _fail("kafka.bootstrap_servers", "", "host:port[,host:port...]", servers)
    password_file = merged.get("kafka_sasl_password_file")
    if password_file is not None and "sasl.password" in extra:
        raise ConfigError(
            "settings 'kafka.sasl.password' and 'kafka_sasl_password_file' both give Kafka's password: "
            "keep one",
            key="kafka_sasl_password_file",
        )
    # The file is read by each client as it is made (cdc.stream.sink); here its presence stands for it.
    validate_kafka_config({**extra, "sasl.password": "from-file"} if password_file is not None else extra)
    return KafkaSettings(bootstrap_servers=servers, extra=MappingProxyType(extra))


def _check(s: Settings, merged: Mapping[str, tuple[object, str]], require_database: bool = True) -> None:
    def where(key: str) -> str:
        return f" ({merged[key][1]})" if key in merged else ""

    if require_database and not s.database_url.strip():
        raise ConfigError("setting 'database_url' must not be empty", key="database_url")
    if require_database:
        check_database_url(s.database_url, where("database_url"))
    if s.database_password_file is not None and s.database_password_command is not None:
        raise ConfigError(
            "settings 'database_password_file' and 'database_password_command' both give the password: "
            "keep one",
            key="database_password_command",
        )
    if require_database and (s.database_password_file or s.database_password_command):
        key = "database_password_file" if s.database_password_file else "database_password_command"
        if conninfo_to_dict(s.database_url).get("password"):
            raise ConfigError(
                f"setting 'database_url' carries a password and {key!r} gives one too: remove it from "
                "database_url",
                key=key,
            )
    if not re.fullmatch(r"[a-z0-9_]{1,63}", s.slot):
        raise _fail("slot", where("slot"), "lower-case letters, digits and _ (at most 63)", s.slot)
    if not _IDENT.fullmatch(s.publication):
        raise _fail("publication", where("publication"), "an unquoted identifier", s.publication)
    if not _TOPIC.fullmatch(s.checkpoint_topic):
        raise _fail(
            "checkpoint_topic",
            where("checkpoint_topic"),
            "a Kafka topic name ([A-Za-z0-9._-])",
            s.checkpoint_topic,
        )
    if s.transactional_id is not None and not s.transactional_id.strip():
        raise _fail("transactional_id", where("transactional_id"), "a non-empty name, or unset", "")
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
    if s.delivery == "exactly-once":
        _check_transaction_timeout(s)
    largest = str(s.kafka.extra.get("message.max.bytes", 1_000_000))
    if largest.isdigit() and s.max_in_flight_mb * 2**20 < int(largest):
        # librdkafka refuses a record larger than its whole queue as "queue full", forever.
        raise _fail(
            "max_in_flight_mb",
            where("max_in_flight_mb"),
            f"at least kafka.message.max.bytes ({int(largest)} bytes), since a record larger than the "
            "producer's queue could never be queued",
            s.max_in_flight_mb,
        )
    if s.status_interval >= s.source_silence_timeout:
        # The server hears from a live pipeline every status_interval; a start that finds the slot held by a
        # walsender silent for source_silence_timeout ends it as a dead pipeline's (cdc.stream.preflight).
        raise _fail(
            "status_interval",
            where("status_interval"),
            f"below source_silence_timeout ({s.source_silence_timeout:g} s), since a walsender whose client "
            "is silent that long is taken for a dead pipeline's",
            s.status_interval,
        )
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


def _check_transaction_timeout(s: Settings) -> None:
    """Exactly-once: Kafka aborts a transaction open longer than transaction.timeout.ms. One is open for up to
    transaction_max_seconds (DRAIN_TRANSACTION_SECONDS while draining a backlog, when longer), and its commit
    is retried for up to delivery_timeout; and librdkafka refuses a message timeout (delivery_timeout) longer
    than the transaction timeout."""
    raw = s.kafka.extra.get("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
    try:
        limit = int(raw)
    except (TypeError, ValueError):
        return  # librdkafka's own check names it
    needed = max(s.transaction_max_seconds, DRAIN_TRANSACTION_SECONDS) + s.delivery_timeout
    if needed * 1000 > limit:
        raise ConfigError(
            f"with delivery = 'exactly-once', transaction_max_seconds ({s.transaction_max_seconds:g} s) "
            f"plus delivery_timeout ({s.delivery_timeout:g} s) must fit in kafka.transaction.timeout.ms "
            f"({limit} ms): "
            "a transaction open longer is aborted by Kafka, and librdkafka refuses a delivery timeout above "
            "it. Lower delivery_timeout or transaction_max_seconds, or raise kafka.transaction.timeout.ms "
            "(up to the brokers' transaction.max.timeout.ms, 15 minutes by default)",
            key="delivery_timeout",
        )

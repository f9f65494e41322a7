"""Unit tests of cdc.config: defaults, precedence, rejections, columns, redaction, Kafka passthrough."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from cdc.config import (
    ColumnMap,
    KafkaSettings,
    Settings,
    TableRef,
    describe_dsn,
    redact_dsn,
)
from cdc.config_kafka import validate_kafka_config
from cdc.config_loader import load_settings
from cdc.errors import ConfigError

DSN = "postgresql://cdc@localhost:5432/app"
SECRET = "s3cr3t-PLANT"


def load(
    tmp_path: Path,
    toml: str | None = None,
    env: dict[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    with_dsn: bool = True,
) -> Settings:
    config_file = None
    if toml is not None:
        config_file = tmp_path / "cdc.toml"
        config_file.write_text(toml, encoding="utf-8")
    environ = {"CDC_DATABASE_URL": DSN} if with_dsn else {}
    environ.update(env or {})
    return load_settings(config_file=config_file, environ=environ, overrides=overrides or {})


def rejected(
    tmp_path: Path,
    toml: str | None = None,
    env: dict[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    with_dsn: bool = True,
) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, toml, env, overrides, with_dsn=with_dsn)
    assert info.value.exit_code == 2
    return info.value


# --- defaults -------------------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    s = load(tmp_path)
    assert s.database_url == DSN
    assert s.kafka == KafkaSettings(bootstrap_servers="localhost:9092")
    assert dict(s.kafka.extra) == {}
    assert (s.slot, s.publication) == ("cdc_outbox", "cdc_outbox")
    assert s.table == TableRef(schema="public", name="outbox") and str(s.table) == "public.outbox"
    assert s.columns == ColumnMap()
    assert s.columns.schema_version == "schema_version" and s.columns.created_at == "created_at"
    assert s.schemas_dir == Path("schemas")
    assert s.topic_template == "outbox.event.{aggregate_type}"
    assert s.dlq_topic == "outbox.dlq"
    assert s.value_format == "single-object" and s.schema_registry_url is None
    assert (s.topic_partitions, s.topic_replication_factor, s.create_topics) == (3, None, True)
    assert s.metrics_port is None
    assert (s.status_interval, s.shutdown_timeout, s.delivery_timeout, s.startup_timeout) == (10, 30, 120, 30)
    assert (s.backoff_initial, s.backoff_multiplier, s.backoff_max) == (0.5, 2.0, 30.0)
    assert s.max_in_flight == 20_000 and s.heartbeat_interval == 30.0
    assert (s.on_invalid_event, s.log_level, s.log_format) == ("dlq", "INFO", "text")
    assert dict(s.sources) == {"database_url": "from CDC_DATABASE_URL"}
    assert json.loads(json.dumps(s.redacted()))["kafka"] == {"bootstrap_servers": "localhost:9092"}


def test_settings_are_frozen_and_keyword_only(tmp_path: Path) -> None:
    s = load(tmp_path, overrides={"kafka.linger.ms": "5"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.slot = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.kafka.extra["linger.ms"] = "10"  # type: ignore[index]
    with pytest.raises(TypeError):
        Settings(DSN)  # type: ignore[call-arg]
    assert Settings(database_url=DSN).slot == "cdc_outbox"


# --- precedence -----------------------------------------------------------------------------------------


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    toml = (
        'slot = "from_file"\npublication = "pub_file"\ntable = "app.events"\n'
        '[kafka]\nbootstrap_servers = "f:1"\n'
    )
    s = load(tmp_path, toml)
    assert (s.slot, s.publication, s.kafka.bootstrap_servers) == ("from_file", "pub_file", "f:1")
    assert s.table == TableRef(schema="app", name="events")
    env = {"CDC_SLOT": "from_env", "CDC_KAFKA_BOOTSTRAP_SERVERS": "e:1"}
    s = load(tmp_path, toml, env)
    assert (s.slot, s.publication, s.kafka.bootstrap_servers) == ("from_env", "pub_file", "e:1")
    overrides = {"slot": "from_flag", "kafka.bootstrap_servers": "o:1", "publication": None}
    s = load(tmp_path, toml, env, overrides)
    assert (s.slot, s.publication, s.kafka.bootstrap_servers) == ("from_flag", "pub_file", "o:1")
    assert s.sources["slot"] == "from the overrides"
    assert s.sources["publication"] == f"in {tmp_path / 'cdc.toml'}"
    assert s.sources["kafka.bootstrap_servers"] == "from the overrides"


def test_database_url_from_file_and_cdc_config(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text(f'database_url = "{DSN}"\nslot = "via_cdc_config"\n', encoding="utf-8")
    s = load_settings(config_file=None, environ={"CDC_CONFIG": str(path)}, overrides={})
    assert (s.database_url, s.slot) == (DSN, "via_cdc_config")


def test_env_strings_are_converted(tmp_path: Path) -> None:
    env = {
        "CDC_STATUS_INTERVAL": "2.5",
        "CDC_METRICS_PORT": "9100",
        "CDC_CREATE_TOPICS": "false",
        "CDC_TOPIC_PARTITIONS": "12",
        "CDC_SCHEMAS_DIR": "/srv/schemas",
        "CDC_LOG_LEVEL": "debug",
        "CDC_VALUE_FORMAT": "confluent",
        "CDC_SCHEMA_REGISTRY_URL": "http://registry:8081",
        "CDC_TOPIC_TEMPLATE": "ev.{aggregate_type}.{event_type}",
        "CDC_DLQ_TOPIC": "dead",
        "CDC_STACK_PG_BIN": "/usr/lib/postgresql/15/bin",  # the local stack's own, not a setting
        "CDC_SLOT": "",
    }
    s = load(tmp_path, env=env)
    assert (s.status_interval, s.metrics_port, s.create_topics, s.topic_partitions) == (2.5, 9100, False, 12)
    assert s.schemas_dir == Path("/srv/schemas") and s.log_level == "DEBUG"
    assert (s.value_format, s.schema_registry_url) == ("confluent", "http://registry:8081")
    assert s.topic_template == "ev.{aggregate_type}.{event_type}"
    assert (s.dlq_topic, s.slot) == ("dead", "cdc_outbox")


def test_typed_overrides_and_kafka_table(tmp_path: Path) -> None:
    toml = '[kafka]\nlinger.ms = 20\n"compression.type" = "lz4"\nenable.idempotence = true\n'
    overrides = {"metrics_port": 9200, "shutdown_timeout": 5, "kafka": {"acks": "all"}}
    s = load(tmp_path, toml, overrides=overrides)
    assert s.metrics_port == 9200 and s.shutdown_timeout == 5.0
    assert dict(s.kafka.extra) == {
        "linger.ms": "20",
        "compression.type": "lz4",
        "enable.idempotence": "true",
        "acks": "all",
    }


# --- rejections -----------------------------------------------------------------------------------------


def test_missing_database_url(tmp_path: Path) -> None:
    err = rejected(tmp_path, with_dsn=False)
    assert err.key == "database_url"
    assert str(err) == (
        "setting 'database_url' is required: set CDC_DATABASE_URL or database_url in the config file"
    )


def test_unknown_key_in_file_suggests(tmp_path: Path) -> None:
    err = rejected(tmp_path, 'slott = "x"\n')
    assert err.key == "slott"
    assert str(err) == f"unknown setting 'slott' in {tmp_path / 'cdc.toml'}; did you mean 'slot'?"
    assert rejected(tmp_path, "[slot]\nname = 1\n").key == "slot.name"


def test_unknown_override(tmp_path: Path) -> None:
    err = rejected(tmp_path, overrides={"dlq_topik": "x"})
    assert err.key == "dlq_topik" and "did you mean 'dlq_topic'?" in str(err)


def test_wrong_type_in_file(tmp_path: Path) -> None:
    err = rejected(tmp_path, 'status_interval = "abc"\n')
    assert err.key == "status_interval"
    assert "setting 'status_interval'" in str(err) and "must be a number of seconds, got 'abc'" in str(err)
    assert rejected(tmp_path, "slot = 5\n").key == "slot"
    assert rejected(tmp_path, 'kafka = "x"\n').key == "kafka"


def test_wrong_type_from_env_names_the_variable(tmp_path: Path) -> None:
    err = rejected(tmp_path, env={"CDC_STATUS_INTERVAL": "abc"})
    assert err.key == "status_interval"
    assert str(err) == (
        "setting 'status_interval' (from CDC_STATUS_INTERVAL) must be a number of seconds, got 'abc'"
    )
    assert "CDC_TOPIC_PARTITIONS" in str(rejected(tmp_path, env={"CDC_TOPIC_PARTITIONS": "three"}))
    assert "CDC_CREATE_TOPICS" in str(rejected(tmp_path, env={"CDC_CREATE_TOPICS": "maybe"}))


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("value_format", "avro", "'single-object', 'confluent'"),
        ("on_invalid_event", "drop", "'dlq', 'stop'"),
        ("log_format", "xml", "'text', 'json'"),
        ("log_level", "loud", "'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'"),
    ],
)
def test_bad_enum_lists_allowed_values(tmp_path: Path, key: str, value: str, allowed: str) -> None:
    err = rejected(tmp_path, overrides={key: value})
    assert err.key == key and f"one of {allowed}" in str(err) and repr(value) in str(err)


@pytest.mark.parametrize(
    "key",
    [
        "status_interval",
        "shutdown_timeout",
        "delivery_timeout",
        "startup_timeout",
        "backoff_initial",
        "backoff_max",
        "heartbeat_interval",
    ],
)
@pytest.mark.parametrize("value", [0, -1, "-0.5", float("inf"), True])
def test_durations_must_be_positive(tmp_path: Path, key: str, value: object) -> None:
    err = rejected(tmp_path, overrides={key: value})
    assert err.key == key and f"setting {key!r}" in str(err)


def test_backoff_relations(tmp_path: Path) -> None:
    assert rejected(tmp_path, overrides={"backoff_multiplier": 0.5}).key == "backoff_multiplier"
    err = rejected(tmp_path, overrides={"backoff_initial": 10, "backoff_max": 5})
    assert err.key == "backoff_max" and "backoff_initial" in str(err)


def test_status_interval_stays_below_source_silence_timeout(tmp_path: Path) -> None:
    # A start ends a walsender whose client was silent for source_silence_timeout: a live pipeline must
    # reply more often than that.
    err = rejected(tmp_path, overrides={"status_interval": 30, "source_silence_timeout": 30})
    assert err.key == "status_interval" and "source_silence_timeout" in str(err)


@pytest.mark.parametrize("value", ["0", "70000", "http", "-1", "80.5"])
def test_bad_metrics_port(tmp_path: Path, value: str) -> None:
    err = rejected(tmp_path, env={"CDC_METRICS_PORT": value})
    assert err.key == "metrics_port" and "CDC_METRICS_PORT" in str(err) and "port" in str(err)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("topic_partitions", 0),
        ("topic_replication_factor", -1),
        ("max_in_flight", 0),
        ("max_in_flight", 1.5),
        ("max_in_flight_mb", 0),
        ("create_topics", "perhaps"),
        ("table", "a.b.c"),
        ("table", "public.out box"),
        ("table", ""),
        ("slot", "Bad-Slot"),
        ("publication", "pub;drop"),
        ("dlq_topic", "dead letters"),
        ("topic_template", "outbox event.{aggregate_type}"),
        ("schemas_dir", 3),
        ("database_url", " "),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, key: str, value: object) -> None:
    err = rejected(tmp_path, overrides={key: value})
    assert err.key == key and repr(key) in str(err)


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("outbox.{aggregate}", "{aggregate}"),
        ("outbox.{}", "{}"),
        ("outbox.{0}", "{0}"),
        ("outbox.{aggregate_type!r}", "{aggregate_type}"),
    ],
)
def test_topic_template_unknown_placeholder(tmp_path: Path, template: str, named: str) -> None:
    err = rejected(tmp_path, overrides={"topic_template": template})
    assert err.key == "topic_template" and f"unknown placeholder {named}" in str(err)


def test_topic_template_malformed(tmp_path: Path) -> None:
    assert rejected(tmp_path, overrides={"topic_template": "outbox.{aggregate_type"}).key == "topic_template"


def test_confluent_needs_registry(tmp_path: Path) -> None:
    err = rejected(tmp_path, env={"CDC_VALUE_FORMAT": "confluent"})
    assert err.key == "schema_registry_url" and "CDC_SCHEMA_REGISTRY_URL" in str(err)
    err = rejected(tmp_path, overrides={"schema_registry_url": f"ftp://u:{SECRET}@registry"})
    assert err.key == "schema_registry_url" and SECRET not in str(err)


def test_config_file_problems(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    err = pytest.raises(ConfigError, load_settings, config_file=missing, environ={}, overrides={}).value
    assert str(missing) in str(err)
    err = rejected(tmp_path, "slot = \n")
    assert "not valid TOML" in str(err)


# --- columns --------------------------------------------------------------------------------------------


def test_debezium_preset(tmp_path: Path) -> None:
    s = load(tmp_path, 'columns = "debezium"\n')
    assert s.columns == ColumnMap(
        id="id",
        aggregate_type="aggregatetype",
        aggregate_id="aggregateid",
        event_type="type",
        payload="payload",
        schema_version=None,
        headers=None,
        created_at=None,
        tracing_span_context="tracingspancontext",
    )
    assert load(tmp_path, env={"CDC_COLUMNS": "debezium"}).columns == s.columns
    without = load(tmp_path, '[columns]\npreset = "debezium"\ntracing_span_context = false\n')
    assert without.columns.tracing_span_context is None


def test_preset_with_changes(tmp_path: Path) -> None:
    s = load(tmp_path, '[columns]\npreset = "debezium"\nschema_version = "version"\n')
    assert (s.columns.aggregate_type, s.columns.schema_version, s.columns.headers) == (
        "aggregatetype",
        "version",
        None,
    )
    s = load(tmp_path, overrides={"columns": {"payload": "body", "headers": False, "aggregate_id": "agg_id"}})
    assert s.columns == ColumnMap(payload="body", headers=None, aggregate_id="agg_id")


@pytest.mark.parametrize(
    ("columns", "key"),
    [
        ("'debezum'", "columns"),
        ("{ paylod = 'body' }", "columns.paylod"),
        ("{ payload = false }", "columns.payload"),
        ("{ payload = 'id' }", "columns"),
        ("{ event_type = 'not a column' }", "columns.event_type"),
        ("3", "columns"),
    ],
)
def test_bad_columns(tmp_path: Path, columns: str, key: str) -> None:
    err = rejected(tmp_path, f"columns = {columns}\n")
    assert err.key == key
    if key == "columns.paylod":
        assert "did you mean 'payload'?" in str(err)


# --- redaction ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://cdc:{SECRET}@db.example:5433/app?sslmode=require&password={SECRET}",
        f"host=db.example port=5433 dbname=app user=cdc password={SECRET} sslmode=require",
        f"host=db.example user=cdc password='{SECRET} with space' dbname=app",
    ],
)
def test_secrets_never_shown(tmp_path: Path, dsn: str) -> None:
    overrides: dict[str, object] = {
        "database_url": dsn,
        "value_format": "confluent",
        "schema_registry_url": f"https://reg:{SECRET}@registry.example:8081",
        "kafka": {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "cdc",
            "sasl.password": SECRET,
            "ssl.key.password": SECRET,
        },
    }
    s = load(tmp_path, overrides=overrides)
    assert s.database_url == dsn and s.kafka.extra["sasl.password"] == SECRET
    shown = [str(s.redacted()), repr(s), str(s), repr(s.kafka), redact_dsn(dsn), describe_dsn(dsn)]
    for text in shown:
        assert SECRET not in text and "s3cr3t" not in text
    plain = s.redacted()
    assert plain["kafka"] == {
        "bootstrap_servers": "localhost:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "cdc",
        "sasl.password": "***",
        "ssl.key.password": "***",
    }
    assert plain["schema_registry_url"] == "https://reg:***@registry.example:8081"
    assert "db.example" in str(plain["database_url"]) and "***" in str(plain["database_url"])
    assert describe_dsn(dsn).startswith("cdc@db.example:")


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (
            f"postgresql://cdc:{SECRET}@h:5433/app?sslmode=require&password={SECRET}&application_name=x",
            "postgresql://cdc:***@h:5433/app?sslmode=require&password=***&application_name=x",
        ),
        ("postgresql://cdc@h/app", "postgresql://cdc@h/app"),
        (f"postgres://cdc:pa/ss?{SECRET}@h/app", "postgres://cdc:***@h/app"),
        (f"host=h user=cdc password={SECRET} dbname=app", "host=h user=cdc password=*** dbname=app"),
        (
            f"host=h password = '{SECRET} \\' x' sslpassword={SECRET} dbname=app",
            "host=h password = *** sslpassword=*** dbname=app",
        ),
        ("host=h dbname=app", "host=h dbname=app"),
    ],
)
def test_redact_dsn_keeps_everything_but_the_password(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (f"postgresql://cdc:{SECRET}@db:5433/app", "cdc@db:5433/app"),
        ("postgresql://db/app", "db:5432/app"),
        ("postgresql:///app?host=/run/postgresql&user=cdc", "cdc@/run/postgresql:5432/app"),
        (f"host=db port=6432 dbname=app user=cdc password={SECRET}", "cdc@db:6432/app"),
        ("user=cdc", "cdc@localhost:5432/cdc"),
    ],
)
def test_describe_dsn(dsn: str, expected: str) -> None:
    assert describe_dsn(dsn) == expected


# --- librdkafka passthrough -----------------------------------------------------------------------------


def test_kafka_bogus_key(tmp_path: Path) -> None:
    err = rejected(tmp_path, '[kafka]\n"bogus.key" = "1"\n')
    assert err.key == "kafka.bogus.key" and "kafka.bogus.key" in str(err)
    assert "No such configuration property" in str(err)


@pytest.mark.parametrize(
    ("key", "value"), [("linger.ms", "abc"), ("compression.type", "zzz"), ("max.in.flight", "10")]
)
def test_kafka_bogus_value(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_kafka_config({"client.id": "cdc", key: value})
    assert info.value.key == f"kafka.{key}" and f"'kafka.{key}'" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enable.idempotence", "false"),
        ("acks", "1"),
        ("request.required.acks", "0"),
        ("delivery.timeout.ms", "1000"),
        ("transactional.id", "x"),
        ("bootstrap.servers", "h:1"),
        ("max.in.flight.requests.per.connection", "5"),
        ("max.in.flight", "2"),
    ],
)
def test_pipeline_owned_kafka_keys(tmp_path: Path, key: str, value: str) -> None:
    err = rejected(tmp_path, overrides={f"kafka.{key}": value})
    assert err.key == f"kafka.{key}" and "owned by the pipeline" in str(err)


def test_weakening_idempotence_is_rejected() -> None:
    with pytest.raises(ConfigError, match="enable.idempotence=true") as info:
        validate_kafka_config({"enable.idempotence": "false"})
    assert info.value.key == "kafka.enable.idempotence"
    validate_kafka_config({"enable.idempotence": "true", "acks": "all", "linger.ms": "5"})


def test_librdkafka_error_does_not_echo_secrets() -> None:
    with pytest.raises(ConfigError) as info:
        validate_kafka_config({"sasl.password": SECRET, "compression.type": SECRET})
    assert SECRET not in str(info.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_validation_leaves_no_threads() -> None:
    validate_kafka_config({"linger.ms": "5"})
    before = len(os.listdir("/proc/self/task"))
    for _ in range(20):
        validate_kafka_config({"linger.ms": "5"})
        with pytest.raises(ConfigError):
            validate_kafka_config({"bogus.key": "1"})
    deadline = time.monotonic() + 5  # a joined thread's /proc entry can outlive the join by a moment
    while len(os.listdir("/proc/self/task")) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(os.listdir("/proc/self/task")) <= before


@pytest.mark.parametrize("value", ["0.0001", "0.5"])
def test_a_delivery_timeout_below_a_second_is_refused(tmp_path: Path, value: str) -> None:
    # librdkafka's message.timeout.ms = 0 means "never time out": a broker outage would be waited out.
    err = rejected(tmp_path, env={"CDC_DELIVERY_TIMEOUT": value})
    assert err.key == "delivery_timeout" and "at least 1 second" in str(err)


def test_metrics_listen_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    assert load(tmp_path).metrics_host == "127.0.0.1"
    assert load(tmp_path, env={"CDC_METRICS_HOST": "0.0.0.0"}).metrics_host == "0.0.0.0"


# --- CDC_* variables, config files and DSNs that must not slip through --------------------------------------


def test_a_misspelt_variable_is_refused_with_the_name_it_meant(tmp_path: Path) -> None:
    err = rejected(tmp_path, env={"CDC_ON_INVALID_EVNT": "stop"})
    assert err.key == "CDC_ON_INVALID_EVNT" and "did you mean CDC_ON_INVALID_EVENT?" in str(err)


def test_librdkafka_settings_come_from_cdc_kafka_variables(tmp_path: Path) -> None:
    env = {
        "CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CDC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "CDC_KAFKA_SASL_USERNAME": "cdc",
        "CDC_KAFKA_SASL_PASSWORD": SECRET,
    }
    s = load(tmp_path, env=env)
    assert dict(s.kafka.extra) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cdc",
        "sasl.password": SECRET,
    }
    assert s.sources["kafka.sasl.password"] == "from CDC_KAFKA_SASL_PASSWORD"
    assert SECRET not in str(s.redacted())


def test_a_cdc_kafka_variable_that_librdkafka_does_not_know_is_refused(tmp_path: Path) -> None:
    err = rejected(tmp_path, env={"CDC_KAFKA_SECURITY_PROTOCOLL": "SSL"})
    assert err.key == "kafka.security.protocoll"


def test_a_config_file_that_is_not_utf8_is_one_config_error(tmp_path: Path) -> None:
    path = tmp_path / "cdc.toml"
    path.write_bytes(b'slot = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=path, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides={})
    assert info.value.key == "config" and "not UTF-8" in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize(
    "dsn",
    [
        "host=h user=cdc password=abc 2secret dbname=app",  # libpq: missing "=" after "2secret"
        "postgresql://cdc:pa%zz2secret@h/app",  # libpq: invalid percent-encoded token
        "host=h password='2secret",  # an unterminated quote
    ],
)
def test_a_dsn_libpq_cannot_read_is_refused_without_a_fragment_of_it(tmp_path: Path, dsn: str) -> None:
    err = rejected(tmp_path, env={"CDC_DATABASE_URL": dsn}, with_dsn=False)
    assert err.key == "database_url" and "not a connection string libpq can read" in str(err)
    assert "2secret" not in str(err) and "abc" not in str(err)
    assert err.__cause__ is None and err.__suppress_context__
    assert "2secret" not in redact_dsn(dsn) and "abc" not in redact_dsn(dsn)


def test_an_allow_list_of_aggregate_types_from_toml_or_environment(tmp_path: Path) -> None:
    assert load(tmp_path).aggregate_types is None
    assert load(tmp_path, toml='aggregate_types = ["order", "invoice"]').aggregate_types == (
        "order",
        "invoice",
    )
    assert load(tmp_path, env={"CDC_AGGREGATE_TYPES": "order, invoice"}).aggregate_types == (
        "order",
        "invoice",
    )
    err = rejected(tmp_path, toml="aggregate_types = [1]")
    assert err.key == "aggregate_types"
    assert rejected(tmp_path, toml="aggregate_types = []").key == "aggregate_types"


def test_exactly_once_refuses_timeouts_past_the_kafka_transaction_timeout():
    env = {"CDC_DATABASE_URL": "postgresql://u@h/db", "CDC_DELIVERY": "exactly-once"}
    with pytest.raises(ConfigError, match=r"kafka\.transaction\.timeout\.ms \(300000 ms\)") as caught:
        load_settings(config_file=None, environ={**env, "CDC_DELIVERY_TIMEOUT": "400"}, overrides={})
    assert caught.value.key == "delivery_timeout" and caught.value.exit_code == 2
    # room made for it: accepted
    load_settings(
        config_file=None,
        environ={**env, "CDC_DELIVERY_TIMEOUT": "400", "CDC_KAFKA_TRANSACTION_TIMEOUT_MS": "600000"},
        overrides={},
    )
    # at-least-once has no transactions to time out
    load_settings(
        config_file=None,
        environ={**env, "CDC_DELIVERY": "at-least-once", "CDC_DELIVERY_TIMEOUT": "400"},
        overrides={},
    )


def test_the_partitioner_is_javas_unless_set_and_is_not_a_kafka_key(tmp_path: Path) -> None:
    from cdc.stream.kafka_config import producer_config

    assert producer_config(load(tmp_path))["partitioner"] == "murmur2_random"
    chosen = load(tmp_path, env={"CDC_PARTITIONER": "consistent_random"})
    assert producer_config(chosen)["partitioner"] == "consistent_random"
    assert rejected(tmp_path, env={"CDC_PARTITIONER": "murmur2"}).key == "partitioner"
    err = rejected(tmp_path, env={"CDC_KAFKA_PARTITIONER": "murmur2_random"})
    assert err.key == "kafka.partitioner" and "set partitioner" in str(err)


@pytest.mark.parametrize(
    ("env", "key", "says"),
    [
        ({"CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "kafka.sasl.mechanism", "GSSAPI"),
        (
            {"CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CDC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"},
            "kafka.sasl.username",
            "is needed",
        ),
        (
            {
                "CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "CDC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "CDC_KAFKA_SASL_USERNAME": "cdc",
            },
            "kafka.sasl.password",
            "is needed",
        ),
        (
            {"CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CDC_KAFKA_SASL_MECHANISM": "KERBEROS-9"},
            "kafka.sasl.mechanism",
            "does not have",
        ),
        (
            {"CDC_KAFKA_SECURITY_PROTOCOL": "SSL", "CDC_KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
            "kafka.ssl.ca.location",
            "not accepted",
        ),
    ],
)
def test_a_kafka_refusal_names_the_key_to_fix_not_the_one_librdkafka_names(
    tmp_path: Path, env: dict[str, str], key: str, says: str
) -> None:
    err = rejected(tmp_path, env=env)
    assert err.key == key and says in str(err), str(err)


def test_the_producer_queue_must_hold_the_largest_record(tmp_path: Path) -> None:
    err = rejected(tmp_path, env={"CDC_MAX_IN_FLIGHT_MB": "4", "CDC_KAFKA_MESSAGE_MAX_BYTES": "8388608"})
    assert err.key == "max_in_flight_mb" and "8388608" in str(err)
    s = load(tmp_path, None, {"CDC_MAX_IN_FLIGHT_MB": "8", "CDC_KAFKA_MESSAGE_MAX_BYTES": "8388608"}, None)
    assert s.max_in_flight_mb == 8

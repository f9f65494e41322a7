"""The words of librdkafka and libpq turned into the setting or the right to fix (cdc.stream.access, cdc.pg).
The secure stack's tests (tests/integration/secure) meet each of them for real."""

from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import KafkaError

from cdc.config_loader import load_settings
from cdc.errors import AccessDeniedError, SourceConnectionError
from cdc.pg import access_refusal
from cdc.stream.access import authorization_refusal, connection_refusal, topic_rights


def settings(**env: str):
    base = {
        "CDC_DATABASE_URL": "postgresql://u@h/db",
        "CDC_KAFKA_BOOTSTRAP_SERVERS": "broker.invalid:9093",
        "CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CDC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "CDC_KAFKA_SASL_USERNAME": "cdc",
        "CDC_KAFKA_SASL_PASSWORD": "s3cret-password",
    }
    return load_settings(config_file=None, environ={**base, **env}, overrides={})


AUTH = KafkaError._AUTHENTICATION


def test_refused_credentials_name_the_password_setting_and_not_the_password():
    text = "b:9093/bootstrap: SASL authentication error: Authentication failed ... invalid credentials"
    denied = connection_refusal(settings(), [(AUTH, text)])
    assert isinstance(denied, AccessDeniedError) and denied.key == "kafka.sasl.password"
    assert "user 'cdc'" in str(denied) and "s3cret-password" not in str(denied)


def test_a_mechanism_the_listener_does_not_take_names_the_ones_it_does():
    text = (
        "SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL mechanism: broker's supported "
        "mechanisms: SCRAM-SHA-512 (after 301ms in state AUTH_HANDSHAKE)"
    )
    denied = connection_refusal(settings(CDC_KAFKA_SASL_MECHANISM="PLAIN"), [(AUTH, text)])
    assert denied is not None and denied.key == "kafka.sasl.mechanism"
    assert "'PLAIN'" in str(denied) and "(SCRAM-SHA-512)" in str(denied)


def test_tls_to_a_plaintext_listener_names_the_protocol():
    text = "SSL handshake failed: SSL connection closed by peer: connecting to a PLAINTEXT broker listener?"
    denied = connection_refusal(settings(), [(KafkaError._TRANSPORT, text)])
    assert denied is not None and denied.key == "kafka.security.protocol"


def test_a_broker_that_is_only_down_is_not_an_access_problem():
    # broker.invalid does not resolve: no TLS probe can say more, and nothing in the errors blames us.
    errors = [
        (KafkaError._TRANSPORT, "Connection refused"),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
    ]
    assert connection_refusal(settings(CDC_KAFKA_SECURITY_PROTOCOL="PLAINTEXT"), errors, timeout=0.5) is None


@pytest.mark.parametrize(
    ("error", "right"),
    [
        (
            "ProduceRequest for orders.order [1] with 1 message(s) failed: Topic authorization failed",
            "Write on Topic:orders.order",
        ),
        (KafkaError(53, "Transactional Id authorization failed"), "Write on TransactionalId:outbox-cdc.x"),
        (KafkaError(31, "Cluster authorization failed"), "IdempotentWrite on Cluster"),
        (KafkaError(30, "FindCoordinator response error: Group authorization failed"),
         "Describe on Group:outbox-cdc-checkpoint-"),
    ],
)  # fmt: skip
def test_authorization_failures_name_the_grant(error, right):
    denied = authorization_refusal(settings(), [error], transactional_id="outbox-cdc.x")
    assert denied is not None and denied.right == right, denied
    assert "--allow-principal User:cdc" in str(denied)


def test_the_topic_comes_from_whichever_error_names_it():
    report = KafkaError(29, "Broker: Topic authorization failed")
    fatal = "ProduceRequest for t.order [0] with 1 message(s) failed: Broker: Topic authorization failed"
    assert authorization_refusal(settings(), [report, fatal]).right == "Write on Topic:t.order"


def test_other_refusals_are_not_authorization():
    assert authorization_refusal(settings(), [KafkaError(10, "Broker: Message size too large")]) is None


def test_rights_asked_at_the_start():
    assert topic_rights(settings()) == {"outbox.dlq": ("Write", "DescribeConfigs")}
    exactly_once = settings(CDC_DELIVERY="exactly-once")
    assert topic_rights(exactly_once)["outbox.cdc.checkpoints"] == ("Read", "Write")


@pytest.mark.parametrize(
    ("libpq", "key", "says"),
    [
        ('port 5432 failed: SSL error: certificate verify failed', "database_url", "sslrootcert"),
        ('server certificate for "db" does not match host name "x"', "database_url", "not name the host"),
        ('FATAL:  password authentication failed for user "cdc"', "database_password_file", "the password"),
        ('FATAL:  no pg_hba.conf entry for host "h", no encryption', "database_url", "only over TLS"),
    ],
)  # fmt: skip
def test_postgresql_access_refusals_name_the_setting(libpq, key, says):
    try:
        raise SourceConnectionError("cannot connect") from psycopg.OperationalError(libpq)
    except SourceConnectionError as exc:
        denied = access_refusal(exc)
    assert denied is not None and denied.key == key and says in str(denied)


def test_a_postgresql_that_is_starting_is_waited_for():
    starting = psycopg.OperationalError("FATAL:  the database system is starting up")
    assert access_refusal(SourceConnectionError("no cause")) is None
    try:
        raise SourceConnectionError("cannot connect") from starting
    except SourceConnectionError as exc:
        assert access_refusal(exc) is None


def test_the_kafka_password_file_is_read_by_every_client_config(tmp_path):
    from cdc.stream.kafka_config import admin_config, producer_config

    secret = tmp_path / "kafka-password"
    secret.write_text("from-the-file\n")
    s = settings(CDC_KAFKA_SASL_PASSWORD="", CDC_KAFKA_SASL_PASSWORD_FILE=str(secret))
    assert producer_config(s)["sasl.password"] == "from-the-file"
    secret.write_text("rotated\n")
    assert admin_config(s)["sasl.password"] == "rotated"
    assert "from-the-file" not in repr(s) and "rotated" not in repr(s)


def test_a_kafka_password_twice_or_unreadable_is_refused_with_the_key(tmp_path):
    from cdc.errors import ConfigError
    from cdc.stream.kafka_config import producer_config

    with pytest.raises(ConfigError) as both:
        settings(CDC_KAFKA_SASL_PASSWORD_FILE=str(tmp_path / "x"))
    assert both.value.key == "kafka_sasl_password_file" and "both give" in str(both.value)
    missing = settings(CDC_KAFKA_SASL_PASSWORD="", CDC_KAFKA_SASL_PASSWORD_FILE=str(tmp_path / "none"))
    with pytest.raises(ConfigError) as unreadable:
        producer_config(missing)
    assert unreadable.value.key == "kafka_sasl_password_file"

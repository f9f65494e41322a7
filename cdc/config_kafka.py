"""The user's librdkafka keys (``kafka.*``) checked when the settings are read: the keys the pipeline owns
(its delivery guarantees rest on them) or takes from a setting of its own are refused by name, and the rest
are checked by librdkafka itself, so that a typo fails at start with the key named, never later.
"""

from __future__ import annotations

import logging
import re

from confluent_kafka import KafkaException, Producer

from cdc.config import REDACTED, is_secret
from cdc.errors import ConfigError

_OWNED = {
    "enable.idempotence": ("true",),
    "acks": ("all", "-1"),
    "request.required.acks": ("all", "-1"),
    # cdc.stream.kafka_config.FIXED_PRODUCER_CONFIG says why: more in flight can lose acknowledged records.
    "max.in.flight.requests.per.connection": ("1",),
    "max.in.flight": ("1",),
    # Nothing appended behind a refused record: cdc.stream.refusals relies on it to keep each key in order.
    "enable.gapless.guarantee": ("true",),
}
_RESERVED = {
    "bootstrap.servers": "set kafka.bootstrap_servers instead",
    "delivery.timeout.ms": "set delivery_timeout (seconds) instead",
    "message.timeout.ms": "set delivery_timeout (seconds) instead",
    "transactional.id": "set transactional_id (with delivery = 'exactly-once') instead",
    "partitioner": "set partitioner (murmur2_random or consistent_random) instead: the pipeline records it "
    "beside the slot's saved position and refuses to change it unnoticed",
}


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
    error = producer_error(conf) if conf else None
    if error is None:
        return
    for value in (v for k, v in conf.items() if is_secret(k) and v):
        error = error.replace(value, REDACTED)
    missing = _missing_key(conf, error)
    if missing is not None:
        key, what = missing
        env = "CDC_KAFKA_" + key.upper().replace(".", "_")
        raise ConfigError(f"setting 'kafka.{key}' ({env}) {what} (librdkafka: {error})", key=f"kafka.{key}")
    named = [
        n for n in re.findall(r"[\"`]([\w.]+)[\"`]|^(?:Failed to create producer: )?([\w.]+) failed", error)
    ]
    names = [n for pair in named for n in pair if n in conf]
    culprit = names[0] if names else next((k for k in conf if producer_error({k: conf[k]})), None)
    key = f"kafka.{culprit}" if culprit else "kafka"
    raise ConfigError(
        f"setting '{key}' is not accepted by librdkafka: {error} (see librdkafka's "
        "CONFIGURATION.md for the producer properties and their values)",
        key=key,
    )


def _missing_key(conf: dict[str, str], error: str) -> tuple[str, str] | None:
    """librdkafka names the setting it refuses, not the one that is missing (``security.protocol =
    SASL_SSL`` alone fails on GSSAPI, the default mechanism): the key to fix and what is wrong with it,
    when it is one of those."""
    mechanism = "sasl.mechanisms" if "sasl.mechanisms" in conf else "sasl.mechanism"
    choices = "SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or OAUTHBEARER, as the brokers' listener expects"
    if "No provider for SASL mechanism" in error and mechanism not in conf:
        return mechanism, (
            f"is needed: security.protocol = {conf.get('security.protocol')} authenticates with GSSAPI "
            f"(Kerberos) unless a mechanism is set, and this librdkafka has no Kerberos. Set {choices}"
        )
    if "Unsupported SASL mechanism" in error or "No provider for SASL mechanism" in error:
        return mechanism, f"names a mechanism this librdkafka does not have: set {choices}"
    if "sasl.username and sasl.password must be set" in error:
        key = "sasl.username" if not conf.get("sasl.username") else "sasl.password"
        return (
            key,
            f"is needed: {conf.get(mechanism, 'SASL')} authenticates with sasl.username and sasl.password",
        )
    return None


_QUIET = logging.Logger("cdc.config.validate", logging.CRITICAL + 1)  # a detached logger that drops all


def producer_error(user: dict[str, str]) -> str | None:
    try:
        producer = Producer({**user, "enable.idempotence": "true", "acks": "all", "logger": _QUIET})
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        return str(err.str()) if hasattr(err, "str") else str(err)
    except (TypeError, ValueError) as exc:
        return str(exc)
    producer.flush(0)  # nothing queued: returns at once; the producer is destroyed when it goes out of scope
    return None

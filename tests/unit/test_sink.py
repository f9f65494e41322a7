from __future__ import annotations

import logging

from cdc.config import load_settings
from cdc.pipeline import Backoff
from cdc.sink import KafkaLogThrottle, admin_config, producer_config, replication_risk


def settings(**overrides):
    return load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides=overrides
    )


def test_producer_is_idempotent_bounded_and_takes_the_users_keys():
    conf = producer_config(
        settings(**{"kafka.linger.ms": "20", "kafka.compression.type": "zstd", "max_in_flight": 5000})
    )
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["max.in.flight.requests.per.connection"] == 1
    assert conf["linger.ms"] == "20" and conf["compression.type"] == "zstd"
    assert conf["queue.buffering.max.messages"] == 5000
    assert conf["message.timeout.ms"] == 120_000


def test_admin_client_gets_connection_and_security_keys_only():
    conf = admin_config(
        settings(
            **{
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.username": "u",
                "kafka.sasl.password": "p",
                "kafka.linger.ms": "9",
            }
        )
    )
    assert conf == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
    }


def test_backoff_grows_to_its_maximum_and_resets():
    backoff = Backoff(0.5, 2.0, 3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.attempt == 5
    backoff.reset()
    assert backoff.next_delay() == 0.5


# -- librdkafka's own log lines ------------------------------------------------------------------------------


def _librdkafka_record(level: int, facility: str, text: str) -> logging.LogRecord:
    """A record shaped as confluent-kafka hands librdkafka's lines to a logger: "%s [%s] %s" with
    (facility, client name, text)."""
    return logging.LogRecord(
        "cdc.kafka", level, __file__, 0, "%s [%s] %s", (facility, "outbox-cdc#1", text), None
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


REFUSED = "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
PID_RETRY = (
    "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Broker: "
    "Coordinator load in "
    "progress: retrying"
)


def test_a_burst_of_librdkafka_errors_is_one_line_then_a_count(caplog):
    clock = _Clock()
    throttle = KafkaLogThrottle(interval=10, clock=clock)
    caplog.set_level(logging.INFO, logger="cdc.kafka")
    shown = [throttle.filter(_librdkafka_record(logging.ERROR, "FAIL", REFUSED)) for _ in range(35)]
    assert shown.count(True) == 1 and shown[0]
    clock.now += 10
    later = _librdkafka_record(logging.ERROR, "FAIL", REFUSED)
    assert throttle.filter(later)
    assert later.getMessage().endswith("(and 34 more like it in the last 10 s)")
    # Another kind of line is not held back by the first.
    assert throttle.filter(_librdkafka_record(logging.WARNING, "REQTMOUT", "timed out"))


def test_the_start_up_pid_retry_of_a_fresh_broker_is_debug_only(caplog):
    throttle = KafkaLogThrottle(clock=_Clock())
    caplog.set_level(logging.INFO, logger="cdc.kafka")
    record = _librdkafka_record(logging.WARNING, "GETPID", PID_RETRY)
    assert not throttle.filter(record)
    caplog.set_level(logging.DEBUG, logger="cdc.kafka")
    record = _librdkafka_record(logging.WARNING, "GETPID", PID_RETRY)
    assert throttle.filter(record)
    assert record.levelname == "DEBUG"


def test_info_lines_of_librdkafka_are_not_throttled(caplog):
    throttle = KafkaLogThrottle(clock=_Clock())
    caplog.set_level(logging.INFO, logger="cdc.kafka")
    assert all(throttle.filter(_librdkafka_record(logging.INFO, "CONFWARN", "x")) for _ in range(5))


def test_the_sink_logger_carries_the_throttle():
    assert any(isinstance(f, KafkaLogThrottle) for f in logging.getLogger("cdc.kafka").filters)


# -- replication of the topics the pipeline publishes to -----------------------------------------------------


class _Partition:
    def __init__(self, id_: int, replicas: list[int], isrs: list[int]) -> None:
        self.id, self.replicas, self.isrs = id_, replicas, isrs


class _Topic:
    def __init__(self, *partitions: _Partition) -> None:
        self.partitions = {p.id: p for p in partitions}


def test_an_under_replicated_topic_is_a_warning_naming_its_partitions():
    risk = replication_risk("t", _Topic(_Partition(0, [1, 2, 3], [1, 2, 3]), _Partition(1, [1, 2, 3], [1])))
    assert risk is not None
    level, line = risk
    assert level == logging.WARNING and "topic t is under-replicated: partition(s) 1 " in line


def test_a_single_replica_is_said_at_info_and_a_healthy_topic_not_at_all():
    assert replication_risk("t", _Topic(_Partition(0, [1], [1])))[0] == logging.INFO
    assert replication_risk("t", _Topic(_Partition(0, [1, 2, 3], [3, 1, 2]))) is None

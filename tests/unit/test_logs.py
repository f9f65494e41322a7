"""librdkafka's log lines through logging: throttled per kind, the benign start-up retries at DEBUG."""

from __future__ import annotations

import logging

from cdc.logs import KafkaLogThrottle


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


def test_the_kafka_logger_carries_the_throttle():
    assert any(isinstance(f, KafkaLogThrottle) for f in logging.getLogger("cdc.kafka").filters)


# -- replication of the topics the pipeline publishes to -----------------------------------------------------

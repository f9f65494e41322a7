from __future__ import annotations

import logging

from cdc.cli.process_end import librdkafka_threads
from cdc.config_loader import load_settings
from cdc.stream.kafka_config import admin_config, producer_config
from cdc.stream.sink import KafkaSink
from cdc.stream.topics import replication_risk
from cdc.stream.waits import Backoff


def settings(**overrides):
    return load_settings(
        config_file=None, environ={"CDC_DATABASE_URL": "postgresql://u@h/db"}, overrides=overrides
    )


def test_producer_is_idempotent_bounded_and_takes_the_users_keys():
    conf = producer_config(
        settings(
            **{
                "kafka.linger.ms": "20",
                "kafka.compression.type": "zstd",
                "max_in_flight": 5000,
                "max_in_flight_mb": 16,
            }
        )
    )
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["max.in.flight.requests.per.connection"] == 1
    assert conf["linger.ms"] == "20" and conf["compression.type"] == "zstd"
    assert conf["queue.buffering.max.messages"] == 5000
    assert conf["queue.buffering.max.kbytes"] == 16 * 1024
    assert conf["message.timeout.ms"] == 120_000


def test_admin_client_gets_connection_and_security_keys_only():
    conf = admin_config(
        settings(
            **{
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.username": "u",
                "kafka.sasl.password": "p",
                "kafka.enable.ssl.certificate.verification": "false",
                "kafka.ssl.ca.location": "/etc/ca.pem",
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
        "enable.ssl.certificate.verification": "false",
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_backoff_grows_to_its_maximum_and_resets():
    backoff = Backoff(0.5, 2.0, 3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.attempt == 5
    backoff.reset()
    assert backoff.next_delay() == 0.5


# -- librdkafka's own log lines ------------------------------------------------------------------------------


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


def test_close_destroys_both_kafka_clients_and_their_threads_at_once():
    """No client may outlive the run: librdkafka's threads of one alive at the process's exit crash it
    (cdc.cli.process_end). The admin client had a second reference, from the sink's Topics."""
    before = librdkafka_threads()
    sink = KafkaSink(settings(**{"kafka.bootstrap_servers": "127.0.0.1:1"}))
    try:
        assert len(librdkafka_threads()) > len(before)
    finally:
        sink.close()
    assert librdkafka_threads() == before
    sink.close()  # a second close: nothing to do
    assert sink.queue_depth() == 0 and not sink.broker_reachable()

"""A topic `cdc run` creates gets the brokers' default.replication.factor unless topic_replication_factor is
set (issue 43, item 7): a production cluster's default, not a silent 1. Shown on a broker of the test's own
whose default (2) one broker cannot hold: the pipeline's CreateTopics asks for it, and Kafka's refusal is a
configuration error naming topic_replication_factor (exit 2); with the setting, the topic is created so."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from tests.plugins.kafka import client_config
from tests.plugins.pipeline import Outbox, PrivateKafka, _kafka_libs, _running, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_created_topics_get_the_brokers_default_replication_factor(
    outbox: Outbox, pipeline_process, tmp_path, request
):
    broker = PrivateKafka(_kafka_libs(), tmp_path / "private-kafka")
    with open(broker.properties, "a") as properties:
        properties.write("default.replication.factor=2\n")
    with _running(broker, request):
        env = {"CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "CDC_STARTUP_TIMEOUT": "30"}
        refused = pipeline_process(**env)
        assert refused.wait(60) == 2, refused.tail()
        log = refused.log()
        assert "cdc: error: Kafka refused to create topic" in log and "the brokers' default" in log, log[
            -2000:
        ]
        assert "set topic_replication_factor to at most the number of brokers" in log

        proc = pipeline_process(**env, CDC_TOPIC_REPLICATION_FACTOR="1")
        proc.wait_streaming(60)
        txn = outbox.commit([outbox.event("o-1")])
        wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 60, "the event published")
        topic = outbox.topic("order")
        metadata = AdminClient(client_config(broker.bootstrap)).list_topics(topic, timeout=10).topics[topic]
        assert {len(p.replicas) for p in metadata.partitions.values()} == {1}
        assert proc.terminate() == 0, proc.tail()

"""The consumer's configuration and the processed_events SQL, without services."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cdc.cli import main
from cdc.config import TableRef
from cdc.consumer import IdempotentConsumer, RetryPolicy, consumer_config
from cdc.consumer.processed import parse_table, setup_statements
from cdc.errors import ConfigError


def test_the_guarantees_settings_are_fixed_and_the_rest_is_ours_then_the_users():
    conf = consumer_config("k:9092", "invoices", {"session.timeout.ms": 6000, "auto.offset.reset": "latest"})
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["isolation.level"] == "read_committed"
    assert conf["group.id"] == "invoices" and conf["bootstrap.servers"] == "k:9092"
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["session.timeout.ms"] == 6000 and conf["auto.offset.reset"] == "latest"
    assert consumer_config("k", "g")["auto.offset.reset"] == "earliest"
    assert consumer_config("k", "g", {"enable.auto.commit": "false"})["enable.auto.commit"] is False


def test_what_the_consumer_fetches_ahead_is_bounded_and_the_users_to_change():
    # Records (librdkafka's 100,000 bound first for small records), bytes for large ones, and each fetch.
    conf = consumer_config("k", "g")
    assert conf["queued.min.messages"] == 10_000 and conf["queued.max.messages.kbytes"] == 16 * 1024
    assert conf["max.partition.fetch.bytes"] == 256 * 1024
    mine = consumer_config("k", "g", {"queued.max.messages.kbytes": 4096, "queued.min.messages": 2000})
    assert mine["queued.max.messages.kbytes"] == 4096 and mine["queued.min.messages"] == 2000


@pytest.mark.parametrize(
    ("key", "value"), [("enable.auto.commit", True), ("isolation.level", "read_uncommitted")]
)
def test_overriding_a_guarantee_is_a_config_error(key, value):
    with pytest.raises(ConfigError, match=key):
        consumer_config("k", "g", {key: value})


def make(**kwargs):
    base = {
        "name": "inv",
        "topics": ["outbox.event.order"],
        "handler": lambda conn, event: None,
        "database_url": "postgresql://localhost/none",
        "bootstrap_servers": "localhost:1",
    }
    return IdempotentConsumer(**{**base, **kwargs})


def test_the_constructor_connects_to_nothing_and_defaults_the_dlq_and_group():
    consumer = make()
    assert consumer.dlq_topic == "inv.dlq"
    assert consumer._conf["group.id"] == "inv"
    assert make(group_id="g2", dlq_topic="d")._conf["group.id"] == "g2"


def test_the_dead_letter_producer_partitions_as_the_pipeline_does():
    assert make()._producer_conf["partitioner"] == "murmur2_random"
    assert make(partitioner="consistent_random")._producer_conf["partitioner"] == "consistent_random"
    with pytest.raises(ConfigError) as refused:
        make(partitioner="murmur2")
    assert refused.value.key == "partitioner"


def test_retries_must_fit_well_inside_max_poll_interval():
    with pytest.raises(ConfigError, match="max.poll.interval.ms"):
        make(retry=RetryPolicy(attempts=10, max_delay=60), kafka_config={"max.poll.interval.ms": 60_000})
    make(retry=RetryPolicy(attempts=3), kafka_config={"max.poll.interval.ms": 60_000})


def test_a_consumer_needs_a_name_and_topics():
    with pytest.raises(ConfigError):
        make(topics=[])


def test_a_consumer_takes_a_handler_or_a_batch_handler_and_a_batch_handler_alone_serves_one_event():
    for both_or_neither in ({"batch_handler": lambda conn, events: None}, {"handler": None}):
        with pytest.raises(ConfigError) as refused:
            make(**both_or_neither)
        assert refused.value.key == "handler"
    seen: list[list[str]] = []
    consumer = make(handler=None, batch_handler=lambda conn, events: seen.append([e.id for e in events]))
    consumer.handler(None, SimpleNamespace(id="e-1"))  # the per-record path: a batch of one
    assert seen == [["e-1"]]


def test_processed_events_is_keyed_by_event_and_consumer_with_an_index_for_pruning():
    (_, table), (_, index) = setup_statements(TableRef(schema="svc", name="seen"))
    text = table.as_string()
    assert 'CREATE TABLE IF NOT EXISTS "svc"."seen"' in text
    assert "PRIMARY KEY (event_id, consumer)" in text
    assert "processed_at timestamptz NOT NULL DEFAULT now()" in text
    assert (
        index.as_string()
        == 'CREATE INDEX IF NOT EXISTS "seen_processed_at_idx" ON "svc"."seen" (processed_at)'
    )


def test_parse_table():
    assert parse_table("processed_events") == TableRef(schema="public", name="processed_events")
    assert parse_table("svc.seen") == TableRef(schema="svc", name="seen")
    with pytest.raises(ConfigError):
        parse_table("drop table; --")


def test_consumer_setup_dry_run_prints_the_sql_without_a_database():
    result = CliRunner().invoke(
        main, ["consumer", "setup", "--dry-run", "--processed-table", "svc.seen"], env={}
    )
    assert result.exit_code == 0, result.output
    assert 'CREATE TABLE IF NOT EXISTS "svc"."seen"' in result.output
    assert "CREATE INDEX IF NOT EXISTS" in result.output


def test_consumer_prune_refuses_a_bad_duration_with_exit_2():
    result = CliRunner().invoke(
        main, ["consumer", "prune", "--older-than", "a while"], env={"CDC_DATABASE_URL": "postgresql://x/y"}
    )
    assert result.exit_code == 2
    assert "is not a duration" in result.output

"""Each key on the partition Apache Kafka's Java producer would choose (issue 26): a Java service, Kafka
Streams or Debezium writing the same keys to a co-partitioned topic must agree with `cdc run` on every one.
And the partitioner a slot published with is recorded: switching it moves keys, so a start refuses to switch
unless told to."""

from __future__ import annotations

import random
import re
import uuid
from collections import defaultdict

import pytest

from tests.integration.stream.test_exactly_once import read_all
from tests.plugins.kafka import create_topic
from tests.plugins.pipeline import ROOT, Outbox, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITION_COUNTS = (2, 3, 7, 12, 50)


def generated_keys(seed: int = 26) -> list[str]:
    """About 400 aggregate ids of the kinds applications use: the empty one too."""
    rng = random.Random(seed)
    keys = ["", "Tenant/1:Order#3", "0", " ", "a"]
    keys += [f"order-{i}" for i in range(80)]
    keys += [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(80)]
    keys += [str(rng.randrange(10 ** rng.randint(1, 18))) for _ in range(60)]
    keys += [
        f"{word}-{i}" for i, word in enumerate(["Bestellung-ü", "注文", "🛒", "zamówienie-ż", "Ωμέγα"] * 16)
    ]
    keys += [
        "".join(rng.choice("abcdefXYZ0123456789/-_:ü") for _ in range(rng.randint(100, 140)))
        for _ in range(60)
    ]
    return list(dict.fromkeys(keys))


def published_partitions(bootstrap: str, topic: str) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = defaultdict(set)
    for msg in read_all(bootstrap, topic):
        seen[msg.key().decode()].add(msg.partition())
    return seen


def test_the_java_tool_is_built_against_the_brokers_client_version():
    version = re.compile(r"<kafka.version>([^<]+)</kafka.version>")
    broker = version.search((ROOT / "stack" / "kafka" / "pom.xml").read_text())
    tool = version.search((ROOT / "tests" / "java" / "key-partitions" / "pom.xml").read_text())
    assert broker and tool and broker.group(1) == tool.group(1)


@pytest.mark.plain("Kafka's Java producer is run without TLS or SASL settings")
def test_every_key_lands_on_the_partition_javas_producer_chooses(
    outbox: Outbox, pipeline_process, kafka_admin, kafka_bootstrap, java_producer
):
    keys = generated_keys()
    for count in PARTITION_COUNTS:
        create_topic(kafka_admin, outbox.topic(f"p{count}"), partitions=count)
        outbox.commit([outbox.event(key, aggregate_type=f"p{count}") for key in keys])
    proc = pipeline_process()
    proc.wait_streaming()
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed every event")
    assert proc.terminate(timeout=40) == 0, proc.tail()
    differ: dict[int, list[str]] = {}
    for count in PARTITION_COUNTS:
        ours = published_partitions(kafka_bootstrap, outbox.topic(f"p{count}"))
        assert set(ours) == set(keys), f"{len(set(keys) - set(ours))} keys missing from p{count}"
        assert all(len(p) == 1 for p in ours.values()), "a key split over two partitions"
        twin = f"{outbox.topic(f'p{count}')}.java"
        create_topic(kafka_admin, twin, partitions=count)
        outbox.topics.append(twin)
        javas = java_producer.partitions(kafka_bootstrap, twin, keys)
        differ[count] = [k for k, p in zip(keys, javas, strict=True) if ours[k] != {p}]
    wrong = {count: len(ks) for count, ks in differ.items() if ks}
    assert not wrong, f"keys on another partition than Java's, per partition count: {wrong}; e.g. {differ}"


def recorded(outbox: Outbox) -> tuple[str | None, bool]:
    row = outbox.conn.execute(
        "SELECT partitioner, confirmed_lsn IS NOT NULL FROM public.cdc_checkpoint WHERE slot = %s",
        (outbox.settings.slot,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def published_and_stopped(outbox: Outbox, proc, key: str) -> None:
    proc.wait_streaming()
    txn = outbox.commit([outbox.event(key)])
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the event confirmed")
    wait_until(lambda: recorded(outbox)[1], 30, "the saved position")
    assert proc.terminate(timeout=40) == 0, proc.tail()


def test_a_slot_keeps_its_partitioner_unless_the_switch_is_confirmed(outbox: Outbox, pipeline_process):
    published_and_stopped(outbox, pipeline_process(CDC_PARTITIONER="consistent_random"), "k-1")
    assert recorded(outbox)[0] == "consistent_random"

    refused = pipeline_process()  # the default, murmur2_random
    assert refused.wait(timeout=40) == 2, refused.tail()
    assert "published its events with partitioner = 'consistent_random'" in refused.tail()
    assert "--accept-partitioner-change" in refused.tail()
    assert recorded(outbox)[0] == "consistent_random", "a refused start changed the record"

    published_and_stopped(outbox, pipeline_process("--accept-partitioner-change"), "k-2")
    assert recorded(outbox)[0] == "murmur2_random"
    published_and_stopped(outbox, pipeline_process(), "k-3")  # the switch is confirmed once


def test_a_slot_that_published_before_the_partitioner_was_recorded_had_librdkafkas_default(
    outbox: Outbox, pipeline_process
):
    published_and_stopped(outbox, pipeline_process(), "k-1")
    outbox.conn.execute(
        "UPDATE public.cdc_checkpoint SET partitioner = NULL WHERE slot = %s", (outbox.settings.slot,)
    )
    refused = pipeline_process()
    assert refused.wait(timeout=40) == 2, refused.tail()
    assert "partitioner = 'consistent_random'" in refused.tail()
    published_and_stopped(outbox, pipeline_process(CDC_PARTITIONER="consistent_random"), "k-2")
    assert recorded(outbox)[0] == "consistent_random"

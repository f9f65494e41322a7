"""What the compiled producer put in Kafka, read back: every record's key, value, headers (in order) and
timestamp equal to the reference's, for the 20 000 captured events, on topics of their own.

    . .stack/env && .venv/bin/python -m prototypes.compiled_loop.verify_kafka
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from prototypes.compiled_loop.fastpath import Glue
from prototypes.compiled_loop.produce_bench import conf
from prototypes.compiled_loop.reference import Reference, load_inputs

HERE = Path(__file__).parent


def main() -> None:
    bootstrap = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    template = f"proto15e-verify-{int(time.time())}.{{aggregate_type}}"
    messages = load_inputs(HERE / "inputs.bin")
    ref = Reference()
    ref.router._template = template
    expected = ref.run(messages)
    topics = sorted({e[0] for e in expected})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1) for t in topics]).values():
        f.result()
    glue_ref = Reference()
    glue_ref.router._template = template
    glue = Glue(glue_ref)
    glue.attach_producer(conf())
    fallback_events = []
    for i in range(0, len(messages), 500):
        # The fallbacks (a route's first batch) come back as reference outputs: produced from Python here.
        fallback_events += glue.run(messages[i : i + 500], produce=True)
    assert glue.fp.flush(30_000) == 0
    acked, failed, _ = glue.fp.poll(0)
    glue.fp.close()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "proto15e-verify", "enable.auto.commit": False})
    consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(3)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(expected) - len(fallback_events) and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            if m.error() is None:
                got.append((m.topic(), m.key(), m.value(), [(k, v) for k, v in m.headers() or []],
                            m.timestamp()[1]))
    consumer.close()
    produced = [e for e in expected if e not in fallback_events]

    def norm(e):
        return (e[0], e[1], e[2], [(k, bytes(v)) for k, v in e[3]], e[4])

    same = sorted(map(norm, produced), key=repr) == sorted(map(norm, got), key=repr)
    print(f"compiled producer: {len(got)} records read back, {len(produced)} expected "
          f"({len(fallback_events)} fallbacks not produced here); equal to the reference: {same}")


if __name__ == "__main__":
    main()

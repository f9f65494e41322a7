"""`cdc audit` as a user who may not read a topic: a refusal naming the grant (exit 2), never that topic's
events reported missing (a broker leaves a topic its user may not describe out of a listing, which reads
like "no such topic")."""

from __future__ import annotations

import json

import pytest

from tests.integration.ops.test_audit import acknowledged
from tests.plugins.kafka_acl import Grant
from tests.plugins.pipeline import Outbox, cdc

pytestmark = [pytest.mark.secure, pytest.mark.slow]


def test_a_topic_the_audit_may_not_read_is_a_refusal_not_missing_events(
    outbox: Outbox, pipeline_process, consume, kafka_user
):
    proc = pipeline_process()
    proc.wait_streaming()
    txn = outbox.commit([outbox.event(f"o-{i}") for i in range(3)])
    topic = outbox.topic("order")
    assert len(consume(topic, 3)) == 3
    acknowledged(outbox, txn.created_at)
    assert proc.terminate(30) == 0

    group = Grant("group", f"cdc-audit-{outbox.slot}", ("Describe",))
    dlq = Grant("topic", outbox.dlq_topic, ("Read", "Describe"))
    for rights in (("Describe",), ()):  # may see the topic but not read it; may not even see it
        grants = [group, dlq] + ([Grant("topic", topic, rights)] if rights else [])
        user = kafka_user(*grants)
        done = cdc({**outbox.env, **user.env()}, "audit", "--since", "1h", "--json", timeout=120)
        assert done.returncode == 2, (rights, done.stdout, done.stderr)
        assert f"right Read (and Describe) on Topic:{topic}" in done.stderr, done.stderr
        assert "--operation Read" in done.stderr and user.password not in done.stderr + done.stdout

    user = kafka_user(group, dlq, Grant("topic", topic, ("Read", "Describe")))
    done = cdc({**outbox.env, **user.env()}, "audit", "--since", "1h", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["aggregates"]["order"]["published"] == 3

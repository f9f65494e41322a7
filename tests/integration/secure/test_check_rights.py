"""`cdc check` on the secure stack (issue 43, item 4): Kafka's ACLs a user lacks are named with the grant, as
`cdc run` would refuse them, all at once and before anything is created; with exactly the documented rights
it says `cdc run` would start."""

from __future__ import annotations

import json

import pytest

from tests.integration.secure.test_refusals import pipeline_grants
from tests.plugins.kafka import create_topic
from tests.plugins.kafka_acl import Grant
from tests.plugins.pipeline import Outbox, cdc

pytestmark = [pytest.mark.integration, pytest.mark.secure]


def check(env: dict[str, str]) -> tuple[int, dict]:
    done = cdc(env, "check", "--json", timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def less(grants: dict[str, Grant], *removals: tuple[str, str | None]) -> list[Grant]:
    """The grants without each (name, operation) of ``removals``; an operation of None: the whole grant."""
    out = dict(grants)
    for name, operation in removals:
        if operation is None:
            del out[name]
            continue
        g = out[name]
        out[name] = Grant(g.resource, g.name, tuple(op for op in g.operations if op != operation), g.prefixed)
    return list(out.values())


def failures(body: dict) -> str:
    return " | ".join(f["text"] for f in body["findings"] if f["level"] == "fail")


def test_check_names_each_missing_acl_and_passes_with_the_documented_rights(
    outbox: Outbox, kafka_user, kafka_admin
):
    env = {**outbox.env, "CDC_AGGREGATE_TYPES": "order"}
    grants = pipeline_grants(outbox)

    user = kafka_user(*less(grants, ("idempotence", None)))
    code, body = check({**env, **user.env()})
    assert code == 0 and body["would_start"], body

    # Neither topic exists yet. The event topic's creation is asked about (a CreateTopics that Kafka only
    # validates); the dead-letter topic, on which the user has no right at all, Kafka hides: Write is named,
    # as `cdc run` names it.
    user = kafka_user(*less(grants, ("dlq", None), ("topics", "Create")))
    code, body = check({**env, **user.env()})
    assert code == 2, body
    said = failures(body)
    assert f"the right Write on Topic:{outbox.dlq_topic}" in said, said
    assert f"the right Create on Topic:{outbox.topic('order')}" in said, said
    assert f"--allow-principal User:{user.name}" in said and user.password not in json.dumps(body)

    # Both exist: writing to them, and reading their record limits.
    create_topic(kafka_admin, outbox.dlq_topic)
    create_topic(kafka_admin, outbox.topic("order"), partitions=3)
    user = kafka_user(*less(grants, ("dlq", "Write"), ("topics", "DescribeConfigs")))
    code, body = check({**env, **user.env()})
    assert code == 2, body
    said = failures(body)
    assert f"the right Write on Topic:{outbox.dlq_topic}" in said, said
    assert f"the right DescribeConfigs on Topic:{outbox.topic('order')}" in said, said

"""`cdc dlq list` as a user who may not read the dead-letter topic, or keep its place there: a refusal naming
the grant (exit 2), never "check that the broker is up"."""

from __future__ import annotations

import pytest

from tests.plugins.kafka_acl import Grant
from tests.plugins.pipeline import Outbox, cdc

pytestmark = [pytest.mark.secure, pytest.mark.slow]


def test_the_dead_letter_tools_name_the_right_they_lack(outbox: Outbox, pipeline_process, kafka_user):
    proc = pipeline_process()
    proc.wait_streaming()  # cdc run creates the dead-letter topic at its start
    assert proc.terminate(30) == 0
    topic, group = outbox.dlq_topic, f"cdc-dlq-{outbox.dlq_topic}"
    read_topic, read_group = Grant("topic", topic, ("Read",)), Grant("group", group, ("Read",))
    cases = [
        ((read_group,), f"right Read on Topic:{topic}", f"--operation Read --topic {topic}"),
        (
            (read_topic,),
            f"right Read on Group:{group}",
            f"--operation Read --group {group}",
        ),
    ]
    for grants, right, grant in cases:
        user = kafka_user(*grants)
        done = cdc({**outbox.env, **user.env()}, "dlq", "list", timeout=120)
        assert done.returncode == 2, (grants, done.stdout, done.stderr)
        assert right in done.stderr and grant in done.stderr, done.stderr
        assert "broker is up" not in done.stderr and user.password not in done.stderr + done.stdout

    user = kafka_user(read_topic, read_group)
    done = cdc({**outbox.env, **user.env()}, "dlq", "list", timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"nothing unresolved in {topic}" in done.stdout

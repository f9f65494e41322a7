"""The poison-flood brake (`max_dead_letters` per `dead_letter_window`): a flood of bad events stops `cdc run`
with exit 1 and one line, after the source transaction of the last counted dead letter is whole, published
and confirmed, so that a restart goes on after it instead of meeting the same transaction again and again."""

from __future__ import annotations

import pytest

from tests.integration.stream.test_exactly_once import ids, read_all
from tests.plugins.pipeline import order_placed

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_a_flood_stops_the_run_after_its_transaction_and_a_restart_goes_on(
    outbox, pipeline_process, consume, kafka_bootstrap, unique_name, delivery
):
    env = {"CDC_MAX_DEAD_LETTERS": "3", "CDC_DEAD_LETTER_WINDOW": "60", "CDC_DELIVERY": delivery}
    if delivery == "exactly-once":
        env["CDC_CHECKPOINT_TOPIC"] = unique_name("ckpt")
        outbox.topics.append(env["CDC_CHECKPOINT_TOPIC"])
    proc = pipeline_process(**env)
    proc.wait_streaming()
    first = outbox.commit([outbox.event("g-0"), outbox.event("b-0", order_placed("b-0", amount_cents="x"))])
    assert len(consume(outbox.topic("order"), 1)) == 1
    bad = [outbox.event(f"b-{i}", order_placed(f"b-{i}", amount_cents="many")) for i in range(1, 6)]
    # More bad events in one transaction than the limit: it is finished all the same, or no restart
    # would ever get past it.
    flood = outbox.commit([*bad[:2], outbox.event("g-1"), *bad[2:], outbox.event("g-2")])
    after = outbox.commit([outbox.event("g-3")])

    assert proc.wait(60) == 1
    lines = [line for line in proc.log().splitlines() if line.startswith("cdc: error:")]
    assert len(lines) == 1, proc.tail()
    assert lines[0].startswith("cdc: error: 3 dead letters within ")
    assert "(max_dead_letters = 3 per dead_letter_window = 60 s): stopped after confirming" in lines[0]
    assert f"`cdc dlq list` shows them in {outbox.dlq_topic} (at LSN " in lines[0]
    assert "poison-flood brake: 3 dead letters within" in proc.log()
    confirmed = outbox.confirmed_lsn()
    assert flood.lsn_before < confirmed < after.lsn_after, "confirmed through the flood's transaction only"

    dead = read_all(kafka_bootstrap, outbox.dlq_topic)
    assert ids(dead) == {e.id: 1 for e in [first.events[1], *bad]}, "every dead letter of it, once"
    events = read_all(kafka_bootstrap, outbox.topic("order"))
    assert ids(events) == {e.id: 1 for e in [first.events[0], *flood.events[2:3], flood.events[-1]]}

    again = pipeline_process(**env)
    again.wait_streaming()
    assert len(consume(outbox.topic("order"), 4)) == 4, "the restart goes on after the flood"
    assert ids(read_all(kafka_bootstrap, outbox.dlq_topic)) == ids(dead), "and does not meet it again"
    assert again.alive()
    assert again.terminate() == 0

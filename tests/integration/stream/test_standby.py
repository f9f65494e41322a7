"""A standby pipeline (`on_slot_active = "wait"`): it waits while another process streams from the slot and
takes over when the slot is released, by SIGTERM or by kill -9 of the active one, with nothing lost. The
slot admits one walsender, so two never stream at once."""

from __future__ import annotations

import time

import pytest

from tests.plugins.pipeline import Outbox, wait_until

pytestmark = pytest.mark.integration


def ids_in(records) -> set[str]:
    return {r.headers["id"].decode() for r in records}


def test_a_standby_takes_over_after_sigterm_and_after_kill_9_and_nothing_is_lost(
    outbox: Outbox, pipeline_process, consume
):
    active = pipeline_process()
    active.wait_streaming()
    standby = pipeline_process(CDC_ON_SLOT_ACTIVE="wait")
    standby.wait_for_log(r"waiting to take over")
    assert standby.log().count("waiting to take over") == 1  # said once, not per attempt
    topic = outbox.topic("order")

    events = outbox.commit([outbox.event(f"s-{i % 3}") for i in range(20)]).events
    assert ids_in(consume(topic, len(events), timeout=60)) >= {e.id for e in events}
    assert "resuming after confirmed LSN" not in standby.log()  # still waiting: one streams at a time

    assert active.terminate() == 0
    started = time.monotonic()
    standby.wait_for_log(r"streaming from slot", timeout=30)
    took_over_after_sigterm = time.monotonic() - started

    # The next standby, and the active one killed under load.
    second = pipeline_process(CDC_ON_SLOT_ACTIVE="wait")
    second.wait_for_log(r"waiting to take over")
    for n in range(5):
        events += outbox.commit([outbox.event(f"s-{i % 3}") for i in range(50)]).events
        if n == 2:
            standby.kill()
            started = time.monotonic()
    second.wait_for_log(r"streaming from slot", timeout=90)
    took_over_after_kill = time.monotonic() - started
    last = outbox.commit([outbox.event("s-last")])
    events += last.events

    # Replays after the kill -9 bring duplicates: read until every id is there, not until a count.
    expected = {e.id for e in events}
    seen: set[str] = set()
    deadline = time.monotonic() + 90
    while not expected <= seen and time.monotonic() < deadline:
        seen = ids_in(consume(topic, 10 * len(events), timeout=3))
    missing = expected - seen
    assert not missing, f"{len(missing)} events lost across the takeovers"
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 60, "the slot confirmed past the last row")
    assert second.alive(), second.tail()
    assert second.terminate() == 0
    took = f"after SIGTERM: {took_over_after_sigterm:.1f} s, after kill -9: {took_over_after_kill:.1f} s"
    print(f"takeover {took}")
    assert took_over_after_sigterm < 10


def test_without_wait_a_second_pipeline_is_still_refused(outbox: Outbox, pipeline_process):
    active = pipeline_process()
    active.wait_streaming()
    second = pipeline_process()
    assert second.wait(30) == 2
    assert "in use by another process" in second.log()
    assert active.terminate() == 0

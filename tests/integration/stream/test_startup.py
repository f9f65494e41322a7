"""A stop during start-up ends the process at once (issue 43, item 2): every wait at start (Kafka's metadata,
PostgreSQL, a standby's wait for the slot) ends within about a second of SIGTERM, with exit 0, since nothing
was produced; and PostgreSQL and Kafka share one startup_timeout, so that two mistakes cost one wait."""

from __future__ import annotations

import signal
import time

import pytest

from tests.plugins.pipeline import Outbox, free_port

pytestmark = pytest.mark.integration


def stop_after(proc, seconds: float) -> tuple[int, float]:
    """SIGTERM ``seconds`` after the start; (exit code, seconds from the signal to the exit)."""
    time.sleep(seconds)
    assert proc.alive(), proc.tail()
    sent = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    return code, time.monotonic() - sent


def test_sigterm_while_kafka_is_unreachable_at_start_ends_within_a_second(outbox: Outbox, pipeline_process):
    proc = pipeline_process(CDC_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}", CDC_STARTUP_TIMEOUT="45")
    proc.wait_for_log("starting: database")
    code, took = stop_after(proc, 3)
    assert code == 0, proc.tail()
    assert took < 1.5, f"the stop took {took:.1f} s"


def test_sigterm_while_postgresql_is_unreachable_at_start_ends_within_a_second(
    outbox: Outbox, pipeline_process
):
    proc = pipeline_process(
        CDC_DATABASE_URL=f"postgresql://cdc@127.0.0.1:{free_port()}/cdc", CDC_STARTUP_TIMEOUT="45"
    )
    proc.wait_for_log("the start waits for it")
    code, took = stop_after(proc, 1)
    assert code == 0, proc.tail()
    assert took < 1.5, f"the stop took {took:.1f} s"


def test_a_standby_stops_within_a_second(outbox: Outbox, pipeline_process):
    active = pipeline_process()
    active.wait_streaming()
    standby = pipeline_process(CDC_ON_SLOT_ACTIVE="wait")
    standby.wait_for_log("waiting to take over")
    code, took = stop_after(standby, 1)
    assert code == 0 and took < 1.5, (code, took, standby.tail())
    assert active.terminate() == 0


def test_kafka_and_postgresql_unreachable_cost_one_startup_timeout_not_two(outbox: Outbox, pipeline_process):
    proc = pipeline_process(
        CDC_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        CDC_DATABASE_URL=f"postgresql://cdc@127.0.0.1:{free_port()}/cdc",
        CDC_STARTUP_TIMEOUT="6",
    )
    started = time.monotonic()
    code = proc.wait(60)
    took = time.monotonic() - started
    assert code != 0 and "did not answer within startup_timeout = 6 s" in proc.log(), proc.tail()
    assert took < 6 + 4, f"the start took {took:.0f} s to give up"

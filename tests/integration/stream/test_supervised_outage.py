"""An outage never stops the pipeline for good (issue 43, item 1): `cdc run` kept running by the restart rules
of the example systemd unit (read from examples/systemd/outbox-cdc.service and applied as systemd would,
without systemd), with the default delivery_timeout (120 s) and startup_timeout (30 s), and Kafka gone for
three minutes: the run exits 1 when its deliveries time out, the restart exits 1 when Kafka does not answer
at the start, and the restart after that streams again once Kafka is back, with nothing lost.

Kafka "goes" by the proxy in front of a broker of the test's own closing its port: the shared broker is never
stopped. About 3.5 minutes, nearly all of it waiting (marker ``slow``; `make test` runs it in CI)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cdc.config import Settings
from tests.integration.stream.test_exactly_once import ids, read_all
from tests.plugins.pipeline import Outbox, PipelineProcess, wait_until
from tests.plugins.systemd_unit import UnitSupervisor, restart_policy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "examples" / "systemd" / "outbox-cdc.service"
OUTAGE = 180.0  # seconds: longer than delivery_timeout + RestartSec + startup_timeout (155 s by default)


def test_a_three_minute_kafka_outage_under_the_example_unit_ends_streaming_with_nothing_lost(
    outbox: Outbox, pipeline_process, proxied_kafka
):
    broker, proxy = proxied_kafka
    defaults = Settings(database_url="unused")
    assert OUTAGE > defaults.delivery_timeout + defaults.startup_timeout
    env = {
        "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "CDC_DELIVERY_TIMEOUT": f"{defaults.delivery_timeout:g}",
        "CDC_STARTUP_TIMEOUT": f"{defaults.startup_timeout:g}",
    }
    started: list[PipelineProcess] = []

    def spawn() -> PipelineProcess:
        started.append(pipeline_process(**env))
        return started[-1]

    supervisor = UnitSupervisor(restart_policy(UNIT), spawn)
    supervisor.start()
    topic = outbox.topic("order")
    try:
        wait_until(lambda: started, 10, "the first start")
        started[0].wait_streaming(90)
        before = outbox.bulk(100, per_transaction=10)[-1]
        wait_until(lambda: outbox.confirmed_lsn() >= before.lsn_after, 60, "the events before the outage")

        proxy.stop()  # Kafka is gone: connections cut, new ones refused
        down_at = time.monotonic()
        outbox.bulk(100, per_transaction=10, first=100)  # in flight when it went: they time out
        while time.monotonic() - down_at < OUTAGE:
            outbox.commit([outbox.event(f"during-{len(outbox.transactions) % 7}")])
            time.sleep(min(15.0, max(0.0, OUTAGE - (time.monotonic() - down_at))))
        assert supervisor.gave_up is None, (
            f"the unit stopped restarting during the outage: {supervisor.gave_up}"
        )
        proxy.start()  # Kafka is back on the same port
        up_at = time.monotonic()

        last = outbox.transactions[-1]
        wait_until(
            lambda: outbox.confirmed_lsn() >= last.lsn_after,
            defaults.startup_timeout + 90,
            f"the pipeline to stream again after the outage (supervisor: {supervisor.gave_up or 'running'})",
        )
        resumed = time.monotonic() - up_at
        after = outbox.commit([outbox.event("after")])
        wait_until(lambda: outbox.confirmed_lsn() >= after.lsn_after, 60, "an event after the outage")
        missing = outbox.ids() - set(ids(read_all(broker.bootstrap, topic)))
        assert not missing, f"{len(missing)} events lost"
        assert supervisor.running(), "the pipeline is not running after the outage"
    finally:
        code = supervisor.stop()

    codes = [e.code for e in supervisor.exits[:-1]]  # the last is the stop's
    print(f"exits during the outage: {codes}; streaming {resumed:.1f} s after Kafka came back")
    assert codes and set(codes) == {1}, codes
    logs = [proc.log() for proc in started[:-1]]
    assert any("Message timed out; stopping without confirming past it" in log for log in logs), logs[0][
        -2000:
    ]
    assert any("did not answer within startup_timeout = 30 s" in log for log in logs), [
        log[-600:] for log in logs
    ]
    assert code == 0, started[-1].tail()

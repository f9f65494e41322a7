"""The commands against a Kafka broker that has just started (issue 45): each is started while its broker is
down, the broker a moment later, so that the command's first requests meet a broker that is still loading
its coordinators, electing its partitions' leaders, or on a new cluster creating ``__consumer_offsets``. Each
must answer as it does against a settled broker, within startup_timeout.

Before cdc.stream.admin: `cdc dlq list` died of SIGSEGV (exit -11) in librdkafka's ListConsumerGroupOffsets
or failed with COORDINATOR_LOAD_IN_PROGRESS, `cdc audit` exited 1 with NOT_LEADER_FOR_PARTITION.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.children import dying_with_parent
from tests.plugins.pipeline import (
    ROOT,
    Outbox,
    PipelineProcess,
    PrivateKafka,
    order_placed,
    with_stack_security,
)

pytestmark = pytest.mark.slow
BROKER_DELAY = 1.0  # seconds between the command's start and the broker's
# The command's clients try to connect every 100 ms at most (librdkafka backs off up to 10 s by default), so
# that their first requests reach the broker as soon as it listens: while it is still starting.
EAGER = {
    "CDC_STARTUP_TIMEOUT": "60",
    "CDC_KAFKA_RECONNECT_BACKOFF_MS": "50",
    "CDC_KAFKA_RECONNECT_BACKOFF_MAX_MS": "100",
}


def during_start(broker: PrivateKafka, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``cdc *args`` started against the stopped broker, the broker started BROKER_DELAY s later."""
    broker.stop()
    proc = subprocess.Popen(
        dying_with_parent([sys.executable, "-m", "cdc", *args]),
        cwd=ROOT,
        env=with_stack_security({**env, **EAGER}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(BROKER_DELAY)
    mark = broker.launch()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    broker.wait_started(mark)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def published(
    outbox: Outbox,
    private_kafka: PrivateKafka,
    pipeline_process: Callable[..., PipelineProcess],
    unique_name: Callable[[str], str],
) -> dict[str, Any]:
    """An exactly-once pipeline on the private broker has published two events and dead-lettered one, and
    stopped: what the commands then read."""
    env = {
        **outbox.env,
        "CDC_KAFKA_BOOTSTRAP_SERVERS": private_kafka.bootstrap,
        "CDC_DELIVERY": "exactly-once",
        "CDC_CHECKPOINT_TOPIC": unique_name("checkpoints"),
    }
    proc = pipeline_process(**{k: v for k, v in env.items() if k.startswith("CDC_")})
    proc.wait_streaming(60)
    bad = outbox.event("o-bad", order_placed("o-bad", amount_cents="many"))
    outbox.commit([outbox.event("o-1"), bad, outbox.event("o-2")])
    assert len(private_kafka.consume(outbox.dlq_topic, 1, timeout=60)) == 1
    assert len(private_kafka.consume(outbox.topic("order"), 2, timeout=60)) == 2
    assert proc.terminate() == 0
    return {"env": env, "dead": bad.id}


def test_cdc_dlq_list_while_the_broker_starts(published: dict[str, Any], private_kafka: PrivateKafka) -> None:
    """Its group's coordinator is still loading: librdkafka's ListConsumerGroupOffsets crashed on that
    (SIGSEGV) or failed with COORDINATOR_LOAD_IN_PROGRESS."""
    for _ in range(2):
        done = during_start(private_kafka, published["env"], "dlq", "list", "--json")
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
        assert [row["id"] for row in json.loads(done.stdout)] == [published["dead"]]


def test_cdc_audit_while_the_broker_starts(published: dict[str, Any], private_kafka: PrivateKafka) -> None:
    """Its partitions' leaders are not serving yet: NOT_LEADER_FOR_PARTITION made it exit 1."""
    for _ in range(2):
        done = during_start(private_kafka, published["env"], "audit", "--since", "1h", "--json")
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
        report = json.loads(done.stdout)
        assert report["missing"] == 0, report


def test_cdc_status_while_the_broker_starts(published: dict[str, Any], private_kafka: PrivateKafka) -> None:
    done = during_start(private_kafka, published["env"], "status", "--json")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    status = json.loads(done.stdout)
    assert status["checkpoint_problem"] is None, status
    assert status["checkpoint_lsn"] is not None, status


def test_cdc_run_starts_while_the_broker_starts(
    published: dict[str, Any],
    outbox: Outbox,
    private_kafka: PrivateKafka,
    pipeline_process: Callable[..., PipelineProcess],
) -> None:
    """Exactly once: its topics' metadata and record limits, its rights, the checkpoint topic read back, the
    transactional id registered, while the broker starts."""
    env = {k: v for k, v in {**published["env"], **EAGER}.items() if k.startswith("CDC_")}
    private_kafka.stop()
    proc = pipeline_process(**env)
    time.sleep(BROKER_DELAY)
    private_kafka.wait_started(private_kafka.launch())
    proc.wait_streaming(90)
    outbox.commit([outbox.event("o-3")])
    assert len(private_kafka.consume(outbox.topic("order"), 3, timeout=60)) == 3
    assert proc.terminate() == 0

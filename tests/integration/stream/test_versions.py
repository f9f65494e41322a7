"""What each PostgreSQL version speaks: the pgoutput protocol `cdc run` asks for, and on 13 (no logical
messages in pgoutput) the warning at start and heartbeats that still come back, by keepalive."""

from __future__ import annotations

import pytest

from tests.integration.test_metrics import get, metric
from tests.plugins.pipeline import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.core]

PROTOCOL = {13: 1, 14: 2, 15: 3}  # 16 and later: 4


def test_the_pipeline_speaks_the_highest_protocol_of_the_server(outbox, pipeline_process, pg_major):
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port), CDC_HEARTBEAT_INTERVAL="0.5")
    proc.wait_streaming()
    assert f"(pgoutput proto_version {PROTOCOL.get(pg_major, 4)})" in proc.log()
    warned = "pgoutput cannot carry logical messages before 14" in proc.log()
    assert warned is (pg_major < 14), proc.tail()
    # Heartbeats come back on every version: as logical messages from 14, by keepalive on 13.
    wait_until(
        lambda: metric(get(port, "/metrics")[1], "cdc_heartbeats_seen_total") >= 2,
        20,
        "two heartbeats to come back",
    )
    assert proc.terminate() == 0

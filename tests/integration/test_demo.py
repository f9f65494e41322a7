"""`make demo` runs examples/demo.py: keep it working end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.plugins.jaeger import query
from tests.plugins.pipeline import ROOT, wait_until


@pytest.mark.plain(
    "the demo is the plain stack's walk-through: its topics and group are not the secure users'"
)
def test_demo_shows_decoded_events_and_the_dead_letter(pg_admin_dsn, kafka_bootstrap):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=pg_admin_dsn, CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)
    done = subprocess.run(
        [sys.executable, "examples/demo.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for seen in ("CustomerRegistered v1", "OrderPlaced v1", "OrderPlaced v2", "OrderShipped v1"):
        assert seen in out, out
    assert "o-9999" not in out, "the rolled-back event must never arrive"
    assert "reason=payload_invalid" in out
    assert "field 'amount_cents' expects long, got string" in out
    assert "a lot" not in out + done.stderr, "a payload value leaked into the output or the logs"
    assert "cdc run exited with 0" in out
    # The topics cdc run creates are described once their metadata has propagated, not left unchecked.
    assert "cannot read topic" not in out + done.stderr, out + done.stderr
    assert "/trace/" not in out, "without Jaeger, no trace to show"


@pytest.mark.plain(
    "the demo is the plain stack's walk-through: its topics and group are not the secure users'"
)
def test_demo_with_tracing_shows_each_events_trace_in_jaeger(pg_admin_dsn, kafka_bootstrap, jaeger_url):
    """`CDC_STACK_TRACING=1 make demo` (and a second run of the demo: it cleans up after itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_DATABASE_URL=pg_admin_dsn,
        CDC_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        CDC_STACK_JAEGER_URL=jaeger_url,
    )
    again = subprocess.run(
        [sys.executable, "examples/demo.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert again.returncode == 0, "make demo a second time: " + again.stdout + again.stderr
    urls = re.findall(rf"OrderPlaced o-1001: ({re.escape(jaeger_url)}/trace/([0-9a-f]{{32}}))", again.stdout)
    assert urls, again.stdout
    trace_id = urls[0][1]

    def spans() -> list[str]:
        try:
            data = query(jaeger_url, f"/api/traces/{trace_id}")["data"]
        except OSError:  # 404 until it is stored
            return []
        return [span["operationName"] for span in data[0]["spans"]] if data else []

    names = wait_until(spans, 30, "the demo's trace in Jaeger")
    assert len(names) == 1 and names[0].startswith("send demo.") and names[0].endswith(".order"), names

"""`make demo` runs examples/demo.py: keep it working end to end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.plugins.pipeline import ROOT


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
    again = subprocess.run(
        [sys.executable, "examples/demo.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert again.returncode == 0, "make demo a second time: " + again.stdout + again.stderr

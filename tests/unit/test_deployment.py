"""The deployment examples stay consistent with the pipeline's settings."""

from __future__ import annotations

import configparser
from pathlib import Path

from cdc.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(ROOT / "examples/systemd/outbox-cdc.service")
    return parser


def test_systemd_unit_restarts_and_outwaits_the_graceful_shutdown():
    service = unit()["Service"]
    assert service["Restart"] == "always"
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > Settings(database_url="x").shutdown_timeout
    assert service["ExecStart"].split()[1:3] == ["run", "--config"]
    assert service["User"] != "root"


def test_dockerfile_is_slim_and_not_root():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "-slim" in dockerfile
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}


def test_systemd_unit_is_type_notify_with_a_watchdog_cdc_run_feeds():
    """cdc run sends READY=1 and WATCHDOG=1 (cdc.notify): the unit may ask for them. The watchdog is fed every
    half period, at most every second; the start's own waits end within the start timeout."""
    from cdc.notify import TICK
    from tests.plugins.systemd_unit import _seconds

    service = unit()["Service"]
    defaults = Settings(database_url="x")
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    watchdog = _seconds(service["WatchdogSec"])
    assert watchdog / 2 >= 2 * TICK
    start = _seconds(service["TimeoutStartSec"])
    assert start > 2 * defaults.startup_timeout + defaults.query_timeout

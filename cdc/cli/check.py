"""`cdc check`: the preflight (:mod:`cdc.ops.check`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.logs import configure_logging


@click.command()
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
@handles_errors
def check(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Would `cdc run` start? Check everything it needs, report every problem at once, change nothing.

    The configuration and the schemas; PostgreSQL (the connection and the replication connection,
    wal_level, track_commit_timestamp, the role's rights, the slot, the publication, the outbox table's
    columns, WAL senders); Kafka (the brokers, the rights on the topics it knows, the replication factor
    against the cluster); the schema registry. Exit 0 when `cdc run` would start (warnings aside), else the
    code it would exit with: 2 when a setting, a right or a server object must be fixed, 1 for an outage.
    """
    settings = build_settings(config_file, **flags)
    # The findings are the output; the clients' own log lines only with an explicit --log-level.
    configure_logging(flags.get("log_level") or "CRITICAL", settings.log_format)
    from cdc.ops.check import run_checks

    report = run_checks(settings)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.render())
    sys.exit(report.exit_code)

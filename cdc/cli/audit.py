"""`cdc audit`: the outbox table reconciled with Kafka (:mod:`cdc.ops.audit`). Exit 0: nothing missing; 1:
committed events are neither published nor dead-lettered (or the audit could not finish); 2: a window it
refuses to judge, or bad usage."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.errors import AuditError, ConfigError

SHOWN_MISSING = 20  # on a terminal; --json lists every one


def parse_moment(text: str, option: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or a duration before now (``24h``, ``7d``, ``90m``)."""
    from cdc.ops.retention import parse_duration

    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return now - parse_duration(text, option)
        except ConfigError:
            raise ConfigError(
                f"{option} {text!r} is neither a time (2026-12-05T10:00:00Z) nor a duration before now "
                "(24h, 7d, 1h30m)",
                key=option.lstrip("-"),
            ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@click.command()
@settings_options
@click.option(
    "--since", required=True, help="Window start: a time (ISO 8601) or a duration before now (24h)."
)
@click.option("--until", help="Window end (default: the slot's acknowledged position).")
@click.option("--aggregate-type", "aggregate_types", multiple=True, help="Only these aggregate types.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with every missing id.")
@click.option(
    "--margin",
    default="5m",
    show_default=True,
    help="Clock and transaction slack: topics are read from --since minus it, and without commit timestamps "
    "the window must end this long before the acknowledged position.",
)
@click.option(
    "--read-timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds a topic's read may make no progress before the audit fails.",
)
@click.option(
    "--query-timeout", type=float, default=600.0, show_default=True, help="Seconds any statement may take."
)
@handles_errors
def audit(
    config_file: Path | None,
    since: str,
    until: str | None,
    aggregate_types: tuple[str, ...],
    as_json: bool,
    margin: str,
    read_timeout: float,
    query_timeout: float,
    **flags: Any,
) -> None:
    """Reconcile the outbox rows created in a window with the topics and the dead-letter topic: every
    committed event must be published or dead-lettered. Exits 1 when one is missing."""
    from cdc.ops.audit import STATES
    from cdc.ops.audit import audit as run_audit
    from cdc.ops.retention import parse_duration

    settings = build_settings(config_file, **flags)
    now = datetime.now(UTC)
    report = run_audit(
        settings,
        since=parse_moment(since, "--since", now),
        until=None if until is None else parse_moment(until, "--until", now),
        aggregate_types=aggregate_types,
        margin=parse_duration(margin, "--margin"),
        missing_limit=None if as_json else SHOWN_MISSING,
        read_timeout=read_timeout,
        query_timeout=query_timeout,
    )
    window = report.window
    if as_json:
        click.echo(
            json.dumps(
                {
                    "since": window.since.isoformat(),
                    "until": window.until.isoformat(),
                    "acknowledged": window.acknowledged.isoformat(),
                    "by_commit_timestamp": window.by_commit,
                    "topics": report.topics,
                    "aggregates": {k: vars(v) for k, v in sorted(report.aggregates.items())},
                    "missing": report.missing,
                    "missing_ids": report.missing_ids,
                    "without_row": report.without_row,
                },
                indent=2,
            )
        )
    else:
        click.echo(
            f"window {window.since.isoformat(timespec='seconds')} .. "
            f"{window.until.isoformat(timespec='seconds')}"
            f" (rows by {'commit timestamp' if window.by_commit else 'created_at'})"
        )
        columns = ("expected", *STATES, "duplicates")
        click.echo(f"{'AGGREGATE TYPE':<24}" + "".join(f"{c.upper().replace('_', ' '):>14}" for c in columns))
        for name, counts in sorted(report.aggregates.items()):
            click.echo(f"{name:<24}" + "".join(f"{getattr(counts, c):>14}" for c in columns))
        if report.without_row:
            click.echo(
                f"{report.without_row} records of the window have no row: events emitted as logical messages "
                "(outbox_emit_message) leave none, and the audit cannot check them"
            )
        if report.missing_ids:
            more = report.missing - len(report.missing_ids)
            click.echo(
                f"missing: {', '.join(report.missing_ids)}" + (f" and {more} more (--json)" if more else "")
            )
    if report.missing:
        raise AuditError(f"{report.missing} committed events are neither published nor dead-lettered")

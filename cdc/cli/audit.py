"""`cdc audit`: the outbox table reconciled with Kafka (:mod:`cdc.ops.audit`). Exit 0: nothing missing; 1:
committed events are neither published nor dead-lettered (or the audit could not finish); 2: a window it
refuses to judge, or bad usage."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.errors import AccessDeniedError, AuditError, AuditRefusedError, CdcError, ConfigError

if TYPE_CHECKING:
    from cdc.ops.audit import AuditReport

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
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON, with every missing id (streamed, the counts first)."
)
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
@click.option(
    "--metrics-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the verdict as a Prometheus textfile (node_exporter's textfile collector).",
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
    metrics_file: Path | None,
    **flags: Any,
) -> None:
    """Reconcile the outbox rows created in a window with the topics and the dead-letter topic: every
    committed event must be published or dead-lettered. Exits 1 when one is missing."""
    from cdc.ops.audit import audit as run_audit
    from cdc.ops.audit_report import (
        CLEAN,
        FAILED,
        MISSING,
        REFUSED,
        as_table,
        metrics_text,
        write_json,
        write_metrics_file,
    )
    from cdc.ops.retention import parse_duration

    settings = build_settings(config_file, **flags)
    now = datetime.now(UTC)
    window = (
        parse_moment(since, "--since", now),
        None if until is None else parse_moment(until, "--until", now),
    )

    def print_json(report: AuditReport, missing_ids: Iterator[str]) -> None:
        write_json(report, missing_ids, sys.stdout)

    try:
        report = run_audit(
            settings,
            since=window[0],
            until=window[1],
            aggregate_types=aggregate_types,
            margin=parse_duration(margin, "--margin"),
            missing_limit=0 if as_json else SHOWN_MISSING,
            read_timeout=read_timeout,
            query_timeout=query_timeout,
            every_missing=print_json if as_json else None,
        )
    except CdcError as exc:
        if metrics_file is not None:
            result = REFUSED if isinstance(exc, AuditRefusedError | AccessDeniedError) else FAILED
            write_metrics_file(metrics_file, metrics_text(settings.slot, result, now.timestamp()))
        raise
    if metrics_file is not None:
        result = MISSING if report.missing else CLEAN
        write_metrics_file(metrics_file, metrics_text(settings.slot, result, now.timestamp(), report))
    if not as_json:
        for line in as_table(report):
            click.echo(line)
    if report.missing:
        raise AuditError(f"{report.missing} committed events are neither published nor dead-lettered")

"""`cdc recover` and `cdc outbox republish`: the outbox table as the slot's backup, and as history.

Both publish rows through the pipeline's own code (:mod:`cdc.ops.republish`); recover also re-creates a lost
slot in the same snapshot (:mod:`cdc.ops.recover`). Progress: a bar on a terminal, a line per
``PROGRESS_EVERY`` rows otherwise (a log file, a CI job).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cdc.cli.commands import outbox
from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.errors import ConfigError
from cdc.logs import configure_logging
from cdc.pg import database_dsn

PROGRESS_EVERY = 10_000
_DURATION = re.compile(r"(\d+\s*[wdhms]\s*)+\Z")


def parse_time(text: str, option: str) -> datetime:
    """An ISO-8601 time (without an offset: UTC), or a duration (``2h``, ``1d12h``) meaning that long ago."""
    value = text.strip()
    if _DURATION.match(value.lower()):
        from cdc.ops.retention import parse_duration

        return datetime.now(UTC) - parse_duration(value, option)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{option} {text!r} is not a time: give ISO-8601 (2026-12-03T10:00:00+00:00; without an offset "
            "it is UTC) or a duration meaning that long ago (90m, 2h, 1d)",
            key=option.lstrip("-").replace("-", "_"),
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


@contextmanager
def progress_reporter(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A bar on a terminal (stderr), or a line every PROGRESS_EVERY rows."""
    if sys.stderr.isatty():
        with click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True) as bar:
            yield bar.update
        return
    done = 0
    reported = 0

    def update(rows: int) -> None:
        nonlocal done, reported
        done += rows
        if done - reported >= PROGRESS_EVERY or done >= total:
            reported = done
            click.echo(f"{label}: {done} of {total} rows acknowledged", err=True)

    yield update


@click.command()
@settings_options
@click.option(
    "--since",
    help="Republish the rows created since this time (ISO-8601, or a duration ago: 2h) instead of the saved "
    "position minus --margin.",
)
@click.option(
    "--margin",
    default="10m",
    show_default=True,
    help="Subtracted from the saved position's commit time: at least your longest outbox transaction.",
)
@click.option("--accept-gap", is_flag=True, help="Go on even when rows may have been pruned past the start.")
@click.option("--failover", is_flag=True, help="Create the slot as a failover slot (PostgreSQL 17+).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@handles_errors
def recover(
    config_file: Path | None,
    since: str | None,
    margin: str,
    accept_gap: bool,
    failover: bool,
    yes: bool,
    **flags: Any,
) -> None:
    """Re-create a lost slot and republish what it may not have delivered, from the outbox table."""
    from cdc.ops import recover as recovery
    from cdc.ops.retention import parse_duration

    settings = build_settings(config_file, **flags)
    configure_logging(settings.log_level, settings.log_format)
    chosen = recovery.plan(
        settings,
        since=parse_time(since, "--since") if since else None,
        margin=parse_duration(margin, "--margin"),
        accept_gap=accept_gap,
    )
    click.echo(chosen.describe())
    if not yes:
        click.confirm("Re-create the slot and republish these rows?", abort=True)
    with progress_reporter(chosen.rows, "republishing") as progress:
        done = recovery.recover(settings, chosen, failover=failover, progress=progress)
    result = done.result
    click.echo(
        f"recovered slot {settings.slot}: republished {result.published} events and dead-lettered "
        f"{result.dead_lettered} of {result.rows} rows created since {_iso(chosen.since)}; "
        "`cdc run` can start"
    )


@outbox.command("republish")
@settings_options
@click.option("--since", help="Rows created at or after this time (ISO-8601, or a duration ago: 2h).")
@click.option("--until", help="Rows created before this time (ISO-8601, or a duration ago).")
@click.option(
    "--aggregate-type", "aggregate_types", multiple=True, help="Only this aggregate type (repeatable)."
)
@click.option("--event-type", "event_types", multiple=True, help="Only this event type (repeatable).")
@click.option("--id", "ids", multiple=True, help="Only this event id (repeatable).")
@click.option("--all", "every_row", is_flag=True, help="Every row of the table (no filter given).")
@click.option("--dry-run", is_flag=True, help="Count the rows, publish nothing.")
@handles_errors
def outbox_republish(
    config_file: Path | None,
    since: str | None,
    until: str | None,
    aggregate_types: tuple[str, ...],
    event_types: tuple[str, ...],
    ids: tuple[str, ...],
    every_row: bool,
    dry_run: bool,
    **flags: Any,
) -> None:
    """Publish outbox rows again, as `cdc run` would, with a cdc_republished header: backfills, history."""
    from cdc.ops.republish import RowFilter, count_rows, republish
    from cdc.pg import connect

    rows = RowFilter(
        since=parse_time(since, "--since") if since else None,
        until=parse_time(until, "--until") if until else None,
        aggregate_types=aggregate_types,
        event_types=event_types,
        ids=ids,
    )
    if rows.empty and not every_row:
        raise click.UsageError(
            "choose rows with --since, --until, --aggregate-type, --event-type or --id, or --all"
        )
    settings = build_settings(config_file, **flags)
    configure_logging(settings.log_level, settings.log_format)
    with connect(database_dsn(settings)) as conn:
        found = count_rows(conn, settings, rows)
    span = ""
    if found.first_created is not None and found.last_created is not None:
        span = f", created {_iso(found.first_created)} to {_iso(found.last_created)}"
    if dry_run:
        click.echo(f"would republish {found.rows} rows{span}")
        return
    with progress_reporter(found.rows, "republishing") as progress:
        result = republish(
            settings,
            rows,
            mark=f"republish {_iso(datetime.now(UTC))}",
            progress=progress,
        )
    click.echo(
        f"republished {result.published} events and dead-lettered {result.dead_lettered} "
        f"of {result.rows} rows{span}"
    )

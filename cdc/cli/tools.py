"""`cdc schemas list|check|register` and `cdc dlq list|show|replay|discard`: the schemas and the dead
letters."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.config import MODES


@click.group()
def schemas() -> None:
    """The event schemas in schemas_dir: list, check compatibility, register in a schema registry."""


@schemas.command("list")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handles_errors
def schemas_list(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Every schema file: event type, version, record name, fingerprint (or why it does not load)."""
    from cdc.avro.catalog import list_schemas

    settings = build_settings(config_file, require_database=False, **flags)
    infos = list_schemas(settings.schemas_dir)
    if as_json:
        rows = [{**vars(i), "path": str(i.path)} for i in infos]
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'EVENT TYPE':<28} {'VERSION':>7}  {'FINGERPRINT':<16}  RECORD / PROBLEM")
    for i in infos:
        detail = f"ERROR: {i.error}" if i.error else f"{i.name} ({i.fields} fields)"
        click.echo(f"{i.event_type:<28} {'v' + str(i.version):>7}  {i.fingerprint or '-':<16}  {detail}")


@schemas.command("check")
@settings_options
@click.option(
    "--mode",
    type=click.Choice(MODES, case_sensitive=False),
    help="Compatibility mode (default: the schema_compatibility setting, BACKWARD).",
)
@click.option(
    "--registry",
    "against_registry",
    is_flag=True,
    help="Also check the versions the schema registry does not hold yet against those it holds, with our "
    "checker and with the registry's, and report where the two disagree (subjects as `register` names them).",
)
@click.option("--schema-registry-url", help="Confluent-compatible registry (or CDC_SCHEMA_REGISTRY_URL).")
@click.option(
    "--aggregate-type", "aggregate_types", multiple=True, help="With --registry: this aggregate's topic."
)
@click.option("--topic", "topics", multiple=True, help="With --registry: this topic's subjects.")
@handles_errors
def schemas_check(
    config_file: Path | None,
    mode: str | None,
    against_registry: bool,
    schema_registry_url: str | None,
    aggregate_types: tuple[str, ...],
    topics: tuple[str, ...],
    **flags: Any,
) -> None:
    """Parse every schema, require contiguous versions, check each version against the earlier ones; with
    --registry, also against the versions the schema registry holds.

    Exits 1 when anything is wrong, so it can gate a deploy."""
    from cdc.avro.catalog import check_schemas
    from cdc.errors import SchemaCompatibilityError

    settings = build_settings(config_file, require_database=False, **flags)
    report = check_schemas(settings.schemas_dir, (mode or settings.schema_compatibility).upper())
    for event_type, versions in report.versions.items():
        click.echo(f"{event_type}: v{', v'.join(map(str, versions))}")
    for problem in report.problems:
        click.echo(f"FAIL: {problem}")
    failures = len(report.problems)
    if against_registry:
        from dataclasses import replace

        from cdc.avro.deployed import check_deployed
        from cdc.avro.registry import SchemaRegistry
        from cdc.avro.store import SchemaStore

        if schema_registry_url is not None:
            settings = replace(settings, schema_registry_url=schema_registry_url)
        with SchemaRegistry.from_settings(settings, SchemaStore(settings.schemas_dir)) as registry:
            deployed = check_deployed(
                settings, aggregate_types=list(aggregate_types), topics=list(topics), registry=registry
            )
        for line in deployed.lines:
            click.echo(line)
        for problem in deployed.problems:
            click.echo(f"FAIL: {problem}")
        failures += len(deployed.problems) + len(deployed.failing)
    if failures:
        where = (
            f" and the registry {settings.schema_registry_url and deployed.url}" if against_registry else ""
        )
        raise SchemaCompatibilityError(
            f"{failures} schema problem(s) in {report.schemas_dir}{where} under {report.mode}"
        )
    count = sum(map(len, report.versions.values()))
    checked = f"; {len(deployed.checks)} new version(s) agree with the registry" if against_registry else ""
    click.echo(f"ok: {count} schemas in {report.schemas_dir}, {report.mode}{checked}")


@schemas.command("register")
@settings_options
@click.option("--schema-registry-url", help="Confluent-compatible registry (or CDC_SCHEMA_REGISTRY_URL).")
@click.option(
    "--aggregate-type", "aggregate_types", multiple=True, help="Register for this aggregate's topic."
)
@click.option("--topic", "topics", multiple=True, help="Register under this topic's subjects.")
@click.option("--event-type", "event_types", multiple=True, help="Only this event type (repeatable).")
@handles_errors
def schemas_register(
    config_file: Path | None,
    schema_registry_url: str | None,
    aggregate_types: tuple[str, ...],
    topics: tuple[str, ...],
    event_types: tuple[str, ...],
    **flags: Any,
) -> None:
    """Register every version, in order, in the schema registry (sets each subject's compatibility)."""
    from cdc.avro.catalog import register_schemas

    settings = build_settings(config_file, require_database=False, **flags)
    if schema_registry_url is not None:
        from dataclasses import replace

        settings = replace(settings, schema_registry_url=schema_registry_url)
    done = register_schemas(
        settings,
        aggregate_types=list(aggregate_types),
        topics=list(topics),
        event_types=list(event_types) or None,
    )
    for r in done:
        click.echo(f"{r.subject}: {r.event_type} v{r.version} has id {r.schema_id}")


@click.group()
def dlq() -> None:
    """The dead-letter topic: list, inspect, replay or discard events the pipeline could not publish."""


@dlq.command("list")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--summary", is_flag=True, help="Only how many are unresolved per reason.")
@handles_errors
def dlq_list(config_file: Path | None, as_json: bool, summary: bool, **flags: Any) -> None:
    """Unresolved dead-letter records (id, event type, version, reason, time, partition:offset), then how
    many are unresolved per reason."""
    from cdc.ops.dlq import DeadLetterTopic

    settings = build_settings(config_file, require_database=False, **flags)
    with DeadLetterTopic(settings) as topic:
        scan = topic.scan()
    counts = scan.by_reason()
    if as_json:
        rows = [r.summary() for r in scan.listing()]
        click.echo(json.dumps(counts if summary else rows, indent=2))
        return
    if not counts:
        click.echo(f"nothing unresolved in {settings.dlq_topic}")
        return
    if not summary:
        cells = [list(r.summary().values()) for r in scan.listing()]
        _table([["ID", "EVENT TYPE", "VERSION", "REASON", "TIME", "POSITION"], *cells])
        click.echo("")
    _table(
        [
            ["REASON", "UNRESOLVED"],
            *([k, str(v)] for k, v in counts.items()),
            ["total", str(sum(counts.values()))],
        ]
    )


def _table(table: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@dlq.command("show")
@settings_options
@click.argument("record_id", metavar="ID")
@click.option("--payload", is_flag=True, help="Also print the payload (it may hold personal data).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
@handles_errors
def dlq_show(config_file: Path | None, record_id: str, payload: bool, as_json: bool, **flags: Any) -> None:
    """One record (ID: event id or partition:offset): headers, reason and message, and how it was resolved
    (replayed, or discarded by whom and why) when it was."""
    from cdc.errors import DeadLetterError
    from cdc.ops.dlq import DeadLetterTopic

    settings = build_settings(config_file, require_database=False, **flags)
    with DeadLetterTopic(settings) as topic:
        scan = topic.scan()
        try:
            record = scan.find(record_id)
        except DeadLetterError:  # resolved records lie before the bookmark: the whole topic, then
            scan = topic.scan(from_start=True)
            record = scan.find_any(record_id)
        details = scan.details(record, payload)
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    for key, value in details.items():
        if key == "headers":
            click.echo("headers:\n" + "\n".join(f"  {name}: {text}" for name, text in value))
        elif key == "payload":
            click.echo("payload:\n" + json.dumps(value, indent=2))
        elif key == "resolution":
            click.echo(f"resolution: {_resolution(value)}")
        else:
            click.echo(f"{key}: {value}")


def _resolution(r: dict[str, str] | None) -> str:
    if r is None:
        return "unresolved"
    if r["outcome"] == "discarded":
        return f"discarded by {r['by']} at {r['time']} (marker {r['marker']}): {r['reason']}"
    return f"replayed to {r['to']} at {r['time']} (marker {r['marker']})"


@dlq.command("replay")
@settings_options
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "replay_all", is_flag=True, help="Replay every unresolved record.")
@handles_errors
def dlq_replay(config_file: Path | None, ids: tuple[str, ...], replay_all: bool, **flags: Any) -> None:
    """Publish records again to their original topics with the current schemas; exit 1 if any still fails."""
    from cdc.ops.replay import replay

    if bool(ids) == replay_all:
        raise click.UsageError("give the ids of records to replay (see `cdc dlq list`), or --all")
    settings = build_settings(config_file, require_database=False, **flags)
    result = replay(settings, ids, replay_all=replay_all)
    for o in result.outcomes:
        failing = f"still failing {o.id}: {o.reason}: {o.message}"
        click.echo(failing if o.reason else f"replayed {o.id} to {o.topic}")
    if not result.outcomes:
        click.echo(f"nothing to replay in {settings.dlq_topic}")
    if result.failing:
        sys.exit(1)


@dlq.command("discard")
@settings_options
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@click.option("--reason", required=True, help="Why it is not replayed; recorded in the marker.")
@click.option("--by", help="Who discards it (default: the OS user); recorded in the marker.")
@handles_errors
def dlq_discard(
    config_file: Path | None, ids: tuple[str, ...], reason: str, by: str | None, **flags: Any
) -> None:
    """Resolve records without replaying them (like messenger:failed:remove); `cdc dlq show` tells who and
    why."""
    from cdc.ops.discard import discard, who

    settings = build_settings(config_file, require_database=False, **flags)
    for record in discard(settings, ids, reason=reason, by=who() if by is None else by):
        click.echo(f"discarded {record.id} ({record.header('error_reason') or 'no reason'})")

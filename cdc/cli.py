"""The `cdc` command: build the settings, call the library, map CdcError to an exit code and one line.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage, configuration or a refusal to start.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc.compat import MODES
from cdc.config import Settings, load_settings
from cdc.errors import CdcError
from cdc.logs import configure_logging

log = logging.getLogger("cdc")
F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """The flags every command understands; each overrides the TOML file and CDC_* variables."""
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path, dir_okay=False),
            help="TOML settings file (or CDC_CONFIG).",
        ),
        click.option(
            "--database-url", help="libpq URI or conninfo (prefer CDC_DATABASE_URL: flags show in ps)."
        ),
        click.option("--kafka-bootstrap-servers", help="Kafka brokers, host:port[,host:port]."),
        click.option("--slot", help="Logical replication slot name."),
        click.option("--publication", help="Publication name."),
        click.option("--table", help="Outbox table, schema.name."),
        click.option("--schemas-dir", help="Directory of <event_type>/v<N>.avsc schemas."),
        click.option("--topic-template", help="Topic per event, e.g. outbox.event.{aggregate_type}."),
        click.option("--dlq-topic", help="Dead-letter topic."),
        click.option(
            "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)
        ),
        click.option("--log-format", type=click.Choice(["text", "json"])),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_settings(config_file: Path | None, *, require_database: bool = True, **flags: Any) -> Settings:
    overrides: dict[str, object] = {
        "database_url": flags.get("database_url"),
        "kafka.bootstrap_servers": flags.get("kafka_bootstrap_servers"),
    }
    for key in (
        "slot",
        "publication",
        "table",
        "schemas_dir",
        "topic_template",
        "dlq_topic",
        "log_level",
        "log_format",
    ):
        overrides[key] = flags.get(key)
    return load_settings(
        config_file=config_file, environ=os.environ, overrides=overrides, require_database=require_database
    )


def handles_errors(func: F) -> F:
    """One line on stderr and the error's exit code for every CdcError; tracebacks only with DEBUG."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CdcError as exc:
            # Logged where logging is set up (cdc run: text or JSON lines); the one-line message always.
            if logging.getLogger().handlers:
                log.error("%s: %s", type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            click.echo(f"cdc: error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="outbox-cdc")
def main() -> None:
    """outbox CDC: stream a PostgreSQL outbox table from the WAL to Kafka as schema-versioned Avro."""


@main.command()
@settings_options
@handles_errors
def run(config_file: Path | None, **flags: Any) -> None:
    """Run the pipeline until SIGTERM or SIGINT."""
    settings = build_settings(config_file, **flags)
    configure_logging(settings.log_level, settings.log_format)
    from cdc.pipeline import Pipeline  # the pipeline pulls in Kafka and Avro; other commands need neither

    pipeline = Pipeline(settings)

    def stop(signum: int, _frame: object) -> None:
        log.info("received %s: stopping after in-flight events are acknowledged", signal.Signals(signum).name)
        pipeline.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = None
    if settings.metrics_port is not None:
        from cdc.metrics import MetricsServer

        server = MetricsServer(pipeline, settings.metrics_port, settings.metrics_host)
        server.start()
    # What start-up allocated (modules, settings, clients) lives as long as the process: out of the
    # collector's reach, a full collection scans only the stream's own objects (~35 ms less per pause).
    gc.freeze()
    try:
        pipeline.run()
    finally:
        if server is not None:
            server.stop()
        # Shut down and confirmed: a late second signal must not turn the clean exit into a kill while
        # the interpreter winds down (it restores the default handlers, and librdkafka's teardown takes time).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@main.command()
@settings_options
@click.option("--dry-run", is_flag=True, help="Print the SQL instead of running it.")
@click.option(
    "--role",
    metavar="NAME",
    help="Also create a least-privilege role (LOGIN REPLICATION) for `cdc run` (letters, digits and _).",
)
@click.option("--failover", is_flag=True, help="Create the slot as a failover slot (PostgreSQL 17+).")
@handles_errors
def setup(config_file: Path | None, dry_run: bool, role: str | None, failover: bool, **flags: Any) -> None:
    """Create the outbox table, publication and slot (idempotent)."""
    from cdc import setup as setup_module

    settings = build_settings(config_file, **flags)
    configure_logging(settings.log_level, settings.log_format)
    for name, outcome in setup_module.apply(settings, dry_run=dry_run, role=role, failover=failover):
        if dry_run:
            click.echo(f"-- {name}\n{outcome}")
        else:
            click.echo(f"{name}: {outcome}")


@main.command()
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handles_errors
def status(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Slot position, lag and retained WAL, outbox size. Exits non-zero when the slot is missing or lost."""
    from cdc.status import render, slot_status

    settings = build_settings(config_file, **flags)
    report = slot_status(settings)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else render(report))
    problem = report.problem()
    if problem is not None:
        raise problem


@main.command()
@settings_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@handles_errors
def teardown(config_file: Path | None, yes: bool, **flags: Any) -> None:
    """Drop the slot and the publication (the outbox table stays). Refuses while the slot is in use."""
    from cdc.status import teardown as drop

    settings = build_settings(config_file, **flags)
    if not yes:
        click.confirm(
            f"Drop replication slot '{settings.slot}' and publication '{settings.publication}'? "
            "Events not yet confirmed will not be streamed",
            abort=True,
        )
    for line in drop(settings):
        click.echo(line)


@main.group()
def outbox() -> None:
    """Outbox table maintenance."""


@outbox.command("prune")
@settings_options
@click.option("--older-than", required=True, help="Delete rows created longer ago than this: 7d, 12h, 1h30m.")
@click.option("--batch-size", default=10_000, show_default=True, help="Rows deleted per transaction.")
@handles_errors
def outbox_prune(config_file: Path | None, older_than: str, batch_size: int, **flags: Any) -> None:
    """Delete old outbox rows in small batches (safe: the WAL already carried their inserts)."""
    from cdc.retention import parse_duration, prune

    settings = build_settings(config_file, **flags)
    deleted = prune(settings, parse_duration(older_than), batch_size=batch_size)
    click.echo(f"deleted {deleted} rows older than {older_than} from {settings.table}")


@main.group()
def consumer() -> None:
    """processed_events, the guard table of cdc.consumer.IdempotentConsumer, in a service's database."""


_processed_table = click.option(
    "--processed-table", default="public.processed_events", show_default=True, help="The guard table."
)


@consumer.command("setup")
@settings_options
@_processed_table
@click.option("--dry-run", is_flag=True, help="Print the SQL instead of running it.")
@handles_errors
def consumer_setup(config_file: Path | None, processed_table: str, dry_run: bool, **flags: Any) -> None:
    """Create processed_events, keyed (event_id, consumer), in the service's database (idempotent)."""
    from cdc.processed import apply_setup, parse_table

    table = parse_table(processed_table)
    settings = build_settings(config_file, require_database=not dry_run, **flags)
    for what, outcome in apply_setup(settings.database_url, table, dry_run=dry_run):
        click.echo(f"-- {what}\n{outcome}" if dry_run else f"{what}: {outcome}")


@consumer.command("prune")
@settings_options
@_processed_table
@click.option(
    "--older-than",
    required=True,
    help="Forget events processed longer ago than this (7d, 12h): more than the topics' retention.",
)
@click.option("--batch-size", default=10_000, show_default=True, help="Rows deleted per transaction.")
@click.option("--consumer", "consumer_name", help="Only this consumer's rows (default: every consumer's).")
@handles_errors
def consumer_prune(
    config_file: Path | None,
    processed_table: str,
    older_than: str,
    batch_size: int,
    consumer_name: str | None,
    **flags: Any,
) -> None:
    """Delete old processed_events rows in small batches.

    A deleted row forgets its event: a redelivery after that runs the handler again. Keep rows longer than
    any event can come back (the topic's retention, plus the longest consumer lag)."""
    from cdc.processed import parse_table, prune
    from cdc.retention import parse_duration

    table = parse_table(processed_table)
    settings = build_settings(config_file, **flags)
    deleted = prune(
        settings.database_url,
        parse_duration(older_than),
        table=table,
        batch_size=batch_size,
        consumer=consumer_name,
    )
    click.echo(f"deleted {deleted} rows older than {older_than} from {table}")


@main.group()
def schemas() -> None:
    """The event schemas in schemas_dir: list, check compatibility, register in a schema registry."""


@schemas.command("list")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handles_errors
def schemas_list(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Every schema file: event type, version, record name, fingerprint (or why it does not load)."""
    from cdc.catalog import list_schemas

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
@handles_errors
def schemas_check(config_file: Path | None, mode: str | None, **flags: Any) -> None:
    """Parse every schema, require contiguous versions, check each version against the earlier ones.

    Exits 1 when anything is wrong, so it can gate a deploy."""
    from cdc.catalog import check_schemas
    from cdc.errors import SchemaCompatibilityError

    settings = build_settings(config_file, require_database=False, **flags)
    report = check_schemas(settings.schemas_dir, (mode or settings.schema_compatibility).upper())
    for event_type, versions in report.versions.items():
        click.echo(f"{event_type}: v{', v'.join(map(str, versions))}")
    for problem in report.problems:
        click.echo(f"FAIL: {problem}")
    if not report.ok:
        raise SchemaCompatibilityError(
            f"{len(report.problems)} schema problem(s) in {report.schemas_dir} under {report.mode}"
        )
    click.echo(
        f"ok: {sum(map(len, report.versions.values()))} schemas in {report.schemas_dir}, {report.mode}"
    )


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
    from cdc.catalog import register_schemas

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


@main.group()
def dlq() -> None:
    """The dead-letter topic: list, inspect and replay events the pipeline could not publish."""


@dlq.command("list")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handles_errors
def dlq_list(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Unresolved dead-letter records: id, event type, version, reason, time, partition:offset."""
    from cdc import dlq as dead_letters

    settings = build_settings(config_file, require_database=False, **flags)
    with dead_letters.DeadLetterTopic(settings) as topic:
        rows = [r.summary() for r in topic.scan().listing()]
    if as_json or not rows:
        click.echo(json.dumps(rows, indent=2) if as_json else f"nothing unresolved in {settings.dlq_topic}")
        return
    table = [["ID", "EVENT TYPE", "VERSION", "REASON", "TIME", "POSITION"], *(list(r.values()) for r in rows)]
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
    """One unresolved record (ID: event id or partition:offset): headers, reason and message."""
    from cdc import dlq as dead_letters

    settings = build_settings(config_file, require_database=False, **flags)
    with dead_letters.DeadLetterTopic(settings) as topic:
        details = topic.scan().find(record_id).details(payload)
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    for key, value in details.items():
        if key == "headers":
            click.echo("headers:\n" + "\n".join(f"  {name}: {text}" for name, text in value))
        elif key == "payload":
            click.echo("payload:\n" + json.dumps(value, indent=2))
        else:
            click.echo(f"{key}: {value}")


@dlq.command("replay")
@settings_options
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "replay_all", is_flag=True, help="Replay every unresolved record.")
@handles_errors
def dlq_replay(config_file: Path | None, ids: tuple[str, ...], replay_all: bool, **flags: Any) -> None:
    """Publish records again to their original topics with the current schemas; exit 1 if any still fails."""
    from cdc import dlq as dead_letters

    if bool(ids) == replay_all:
        raise click.UsageError("give the ids of records to replay (see `cdc dlq list`), or --all")
    settings = build_settings(config_file, require_database=False, **flags)
    result = dead_letters.replay(settings, ids, replay_all=replay_all)
    for o in result.outcomes:
        failing = f"still failing {o.id}: {o.reason}: {o.message}"
        click.echo(failing if o.reason else f"replayed {o.id} to {o.topic}")
    if not result.outcomes:
        click.echo(f"nothing to replay in {settings.dlq_topic}")
    if result.failing:
        sys.exit(1)


@main.group()
def config() -> None:
    """Inspect the effective configuration."""


@config.command("show")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML-like lines.")
@handles_errors
def config_show(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Print the effective settings, secrets redacted, with where each value came from."""
    settings = build_settings(config_file, **flags)
    data = settings.redacted()
    data.pop("sources", None)  # shown as the comment of each line, or left out of the JSON
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    for key, value in _flatten(data):
        source = settings.sources.get(key, "default")
        click.echo(f"{key} = {json.dumps(value, default=str)}  # {source}")


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) and key in {"kafka", "extra"}:
            out.extend(_flatten(value, prefix if key == "extra" else f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


if __name__ == "__main__":  # pragma: no cover
    main()

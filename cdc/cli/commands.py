"""The `cdc` command group and its commands for the stream and its upkeep: run, setup, status, teardown,
outbox prune, consumer setup|prune, config show. Each builds the settings and calls the library.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import click

from cdc.cli.options import build_settings, handles_errors, settings_options
from cdc.logs import configure_logging, enable_crash_dumps
from cdc.notify import Notifier
from cdc.pg import database_dsn

log = logging.getLogger("cdc")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="outbox-cdc")
def main() -> None:
    """outbox CDC: stream a PostgreSQL outbox table from the WAL to Kafka as schema-versioned Avro."""
    # Every command: a native crash (librdkafka, libpq, the compiled hot path) leaves the Python stack of each
    # thread on stderr, where the log lines go (cdc.logs.enable_crash_dumps).
    enable_crash_dumps()


@main.command()
@settings_options
@click.option(
    "--accept-partitioner-change",
    is_flag=True,
    help="Publish with the configured partitioner although the slot published with another (keys move).",
)
@handles_errors
def run(config_file: Path | None, accept_partitioner_change: bool, **flags: Any) -> None:
    """Run the pipeline until SIGTERM or SIGINT; SIGHUP re-reads schemas_dir."""
    settings = build_settings(config_file, **flags)
    configure_logging(settings.log_level, settings.log_format)
    from cdc.stream import Pipeline  # the pipeline pulls in Kafka and Avro; other commands need neither

    pipeline = Pipeline(settings, accept_partitioner_change=accept_partitioner_change)
    deadline: list[threading.Timer] = []
    notifier: Notifier | None = None

    def stop(signum: int, _frame: object) -> None:
        log.info("received %s: stopping after in-flight events are acknowledged", signal.Signals(signum).name)
        seconds = pipeline.request_stop()
        if notifier is not None:
            notifier.stopping()
        if not deadline:  # however frozen a connection is, the process ends within shutdown_timeout
            # Before anything streamed (a start waiting on Kafka, PostgreSQL or the registry), nothing is in
            # flight: the process ends within a second, with 0, whatever wait it is in.
            starting = seconds < settings.shutdown_timeout
            deadline.append(threading.Timer(seconds, _exit_now, (seconds, 0 if starting else 1)))
            deadline[0].daemon = True
            deadline[0].start()

    def reload(_signum: int, _frame: object) -> None:
        pipeline.request_schema_reload()  # only a flag: the stream's thread re-reads, and logs what it found

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    server = None
    if settings.metrics_port is not None:
        from cdc.metrics import MetricsServer

        server = MetricsServer(pipeline, settings.metrics_port, settings.metrics_host)
        server.start()
    # systemd's Type=notify: READY once streaming, WATCHDOG while the loop turns (cdc.notify).
    notifier = Notifier.from_environment(pipeline)
    if notifier is not None:
        notifier.start()
    # What start-up allocated (modules, settings, clients) lives as long as the process: out of the
    # collector's reach, a full collection scans only the stream's own objects (~35 ms less per pause).
    gc.freeze()
    try:
        pipeline.run()
    finally:
        if server is not None:
            server.stop()
        if notifier is not None:
            notifier.close()
        # Shut down and confirmed: a late second signal must not turn the clean exit into a kill while
        # the interpreter winds down (it restores the default handlers, and librdkafka's teardown takes time).
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)


def _exit_now(seconds: float, code: int) -> None:
    """The shutdown did not end in time (a connection that hangs): exit at once. Nothing more is confirmed
    to the slot, so what was not is published again after a restart; nothing is lost. During start-up
    (``code`` 0) nothing was produced: a stop there is a clean one."""
    if code:
        log.error(
            "the shutdown did not finish within shutdown_timeout (%g s): exiting now; events after the "
            "slot's confirmed position will be published again after a restart",
            seconds,
        )
    else:
        log.info("stopped during start-up, before anything was produced (within %g s)", seconds)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


@main.command()
@settings_options
@click.option("--dry-run", is_flag=True, help="Print the SQL instead of running it.")
@click.option(
    "--role",
    metavar="NAME",
    help=(
        "Also create (or fix) a least-privilege role for `cdc run` (letters, digits and _), with no password "
        "(set it yourself). It gets: LOGIN and REPLICATION (on Amazon RDS: membership in rds_replication); "
        "USAGE on the outbox's schema; SELECT on the outbox table; SELECT, INSERT, UPDATE on cdc_heartbeat; "
        "SELECT, INSERT, UPDATE on cdc_checkpoint. Nothing else."
    ),
)
@click.option("--failover", is_flag=True, help="Create the slot as a failover slot (PostgreSQL 17+).")
@handles_errors
def setup(config_file: Path | None, dry_run: bool, role: str | None, failover: bool, **flags: Any) -> None:
    """Create the outbox table, publication and slot (idempotent)."""
    from cdc.ops import setup as setup_module

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
    from cdc.ops.status import render, slot_status

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
    from cdc.ops.status import teardown as drop

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
@click.option(
    "--drop-partitions",
    is_flag=True,
    help="A partitioned outbox: drop the partitions whose upper bound is older, instead of deleting rows.",
)
@click.option(
    "--audited",
    is_flag=True,
    help="Refuse unless a clean `cdc audit` covered every row it would delete (audited_until).",
)
@handles_errors
def outbox_prune(
    config_file: Path | None,
    older_than: str,
    batch_size: int,
    drop_partitions: bool,
    audited: bool,
    **flags: Any,
) -> None:
    """Delete old outbox rows in small batches (safe: the WAL already carried their inserts)."""
    from cdc.ops import retention

    settings = build_settings(config_file, **flags)
    age = retention.parse_duration(older_than)
    if drop_partitions:
        dropped = retention.drop_partitions(settings, age, audited=audited)
        click.echo(f"dropped {len(dropped)} partitions older than {older_than} of {settings.table}")
        for name in dropped:
            click.echo(f"  {name}")
        return
    deleted = retention.prune(settings, age, batch_size=batch_size, audited=audited)
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
    from cdc.consumer.processed import apply_setup, parse_table

    table = parse_table(processed_table)
    settings = build_settings(config_file, require_database=not dry_run, **flags)
    for what, outcome in apply_setup(database_dsn(settings), table, dry_run=dry_run):
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
    from cdc.consumer.processed import parse_table, prune
    from cdc.ops.retention import parse_duration

    table = parse_table(processed_table)
    settings = build_settings(config_file, **flags)
    deleted = prune(
        database_dsn(settings),
        parse_duration(older_than),
        table=table,
        batch_size=batch_size,
        consumer=consumer_name,
    )
    click.echo(f"deleted {deleted} rows older than {older_than} from {table}")


@main.group()
def config() -> None:
    """Inspect the effective configuration."""


@config.command("show")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML.")
@handles_errors
def config_show(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Print the effective settings as TOML that reads back as the same settings (secrets as ***), with
    where each value came from."""
    settings = build_settings(config_file, **flags)
    data = settings.redacted()
    data.pop("sources", None)  # shown as the comment of each line, or left out of the JSON
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    for key, value in _flatten(data):
        source = settings.sources.get(key, "default")
        # A librdkafka key's dots are not TOML tables: quoted, it reads back as the one key it is.
        name = f'kafka."{key[6:]}"' if key.startswith("kafka.") and key != "kafka.bootstrap_servers" else key
        # TOML has no null: a setting that is not set is a comment.
        line = f"# {name} is not set" if value is None else f"{name} = {_toml(value)}"
        click.echo(f"{line}  # {source}")


def _toml(value: Any) -> str:
    """A TOML value. A JSON string is a TOML basic string when it is not ASCII-escaped (TOML takes no
    surrogate escapes); a column that does not exist is false in the columns table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(False if v is None else v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value), ensure_ascii=False)


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

"""What every `cdc` command shares: the settings flags, building the settings, and mapping a CdcError to an
exit code and one line on stderr (0 ok, 1 runtime failure, 2 bad usage, configuration or a refusal).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc.config import Settings
from cdc.config_loader import load_settings
from cdc.errors import CdcError

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
            "--log-level",
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
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

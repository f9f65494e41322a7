"""The `cdc` command line (click). Thin: build the settings, call the library, map a CdcError to an exit code
and a one-line message (:mod:`cdc.cli.options`). The commands: :mod:`cdc.cli.commands` (run, setup, status,
teardown, outbox, consumer, config) and :mod:`cdc.cli.tools` (schemas, dlq).
"""

from __future__ import annotations

from cdc.cli.commands import main
from cdc.cli.tools import dlq, schemas

main.add_command(schemas)
main.add_command(dlq)

__all__ = ["main"]

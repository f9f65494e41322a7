"""The `cdc` command line (click). Thin: build the settings, call the library, map a CdcError to an exit code
and a one-line message (:mod:`cdc.cli.options`). The commands: :mod:`cdc.cli.commands` (run, setup, status,
teardown, outbox, consumer, config), :mod:`cdc.cli.tools` (schemas, dlq) and :mod:`cdc.cli.recovery`
(recover, outbox republish), :mod:`cdc.cli.audit` (audit) and :mod:`cdc.cli.check` (check).
"""

from __future__ import annotations

from cdc.cli.audit import audit
from cdc.cli.check import check
from cdc.cli.commands import main
from cdc.cli.recovery import recover
from cdc.cli.tools import dlq, schemas

main.add_command(schemas)
main.add_command(dlq)
main.add_command(recover)
main.add_command(audit)
main.add_command(check)

__all__ = ["main"]

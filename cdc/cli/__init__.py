"""The `cdc` command line (click). Thin: build the settings, call the library, map a CdcError to an exit code
and a one-line message (:mod:`cdc.cli.options`). The commands: :mod:`cdc.cli.commands` (run, setup, status,
teardown, outbox, consumer, config), :mod:`cdc.cli.tools` (schemas, dlq) and :mod:`cdc.cli.recovery`
(recover, outbox republish), :mod:`cdc.cli.audit` (audit) and :mod:`cdc.cli.check` (check). The `cdc`
executable is :func:`entry`: the commands, then an end that no Kafka client's thread outlives
(:mod:`cdc.cli.process_end`).
"""

from __future__ import annotations

from typing import NoReturn

from cdc.cli.audit import audit
from cdc.cli.check import check
from cdc.cli.commands import main
from cdc.cli.process_end import end, exit_status
from cdc.cli.recovery import recover
from cdc.cli.tools import dlq, schemas

main.add_command(schemas)
main.add_command(dlq)
main.add_command(recover)
main.add_command(audit)
main.add_command(check)


def entry() -> NoReturn:
    """The `cdc` executable (and `python -m cdc`): click's group, whose standalone mode ends in SystemExit."""
    try:
        main()
    except SystemExit as exc:
        code = exit_status(exc)
    else:
        code = 0
    end(code)  # not inside the except: an error's traceback can hold a client (a frame of one of its calls)


__all__ = ["entry", "main"]

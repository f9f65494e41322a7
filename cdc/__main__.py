"""`python -m cdc`: the `cdc` command."""

from cdc.cli import entry

entry()

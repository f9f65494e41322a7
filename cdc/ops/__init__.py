"""The operations wing: what runs beside the stream, from the `cdc` commands.

- :mod:`~cdc.ops.setup`: ``cdc setup``, the outbox table, publication, slot and least-privilege role;
- :mod:`~cdc.ops.status`: ``cdc status`` (slot position, lag, retained WAL) and ``cdc teardown``;
- :mod:`~cdc.ops.retention`: ``cdc outbox prune``;
- :mod:`~cdc.ops.dlq` and :mod:`~cdc.ops.replay`: ``cdc dlq list|show|replay``.

It may use the stream wing (its source and sink), the Avro wing and the base modules; nothing below it
imports it.
"""

from __future__ import annotations

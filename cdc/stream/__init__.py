"""The stream wing: PostgreSQL's WAL to Kafka, one event at a time, never confirming what Kafka has not got.

The data flow, module by module:

- :mod:`~cdc.stream.source`: the replication connection to the slot (psycopg 3), and the checks before it;
- :mod:`~cdc.stream.pgoutput` and :mod:`~cdc.stream.messages`: pgoutput's bytes to frozen dataclasses,
  pure;
- :mod:`~cdc.stream.route`: an outbox row or logical message to an event's fields and its topic;
- the event is encoded by the Avro wing (:mod:`cdc.avro`);
- :mod:`~cdc.stream.sink`: the idempotent Kafka producer and the topics;
- :mod:`~cdc.stream.checkpoint`: which WAL position may be confirmed, from Kafka's acknowledgements;
- :mod:`~cdc.stream.refusals`: records Kafka refuses, found and dead-lettered without reordering a key;
- :mod:`~cdc.stream.heartbeat`: keeps an idle slot moving;
- the pipeline, in four parts: :mod:`~cdc.stream.pipeline` (the hot loop), :mod:`~cdc.stream.delivery`
  (sending, dead letters), :mod:`~cdc.stream.lifecycle` (start, reconnect, replay, shutdown) and
  :mod:`~cdc.stream.waits` (waiting without losing the slot).

It uses the base modules (:mod:`cdc.config`, :mod:`cdc.errors`) and the Avro wing; it never imports the
operations wing, the consumer wing or the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc.stream.pipeline import Pipeline

__all__ = ["Pipeline"]


def __getattr__(name: str) -> Any:
    # On demand: the commands that use only the source or the sink do not load the pipeline.
    if name == "Pipeline":
        from cdc.stream.pipeline import Pipeline

        return Pipeline
    raise AttributeError(f"module 'cdc.stream' has no attribute {name!r}")

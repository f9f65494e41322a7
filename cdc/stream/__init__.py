"""The stream wing: PostgreSQL's WAL to Kafka, one event at a time, never confirming what Kafka has not got.

The data flow, module by module:

- :mod:`~cdc.stream.source`: the replication connection to the slot (psycopg 3), and the checks before it
  (:mod:`~cdc.stream.preflight`);
- :mod:`~cdc.stream.pgoutput` and :mod:`~cdc.stream.messages`: pgoutput's bytes to frozen dataclasses,
  pure;
- :mod:`~cdc.stream.route`: an outbox row or logical message to an event's fields and its topic;
  :mod:`~cdc.stream.routes`: the cached (topic, encoder) of each kind of event, the Avro wing's schemas;
- :mod:`~cdc.stream.emit`: an event to a record; :mod:`~cdc.stream.sender` and :mod:`~cdc.stream.sink`
  (with :mod:`~cdc.stream.topics`): the idempotent Kafka producer; :mod:`~cdc.stream.deadletters`: what cannot
  be published as it is;
- :mod:`~cdc.stream.publisher` and :mod:`~cdc.stream.exactly_once`: the delivery modes (with
  :mod:`~cdc.stream.transactions`, :mod:`~cdc.stream.identity` and :mod:`~cdc.stream.checkpoint_topic`);
- :mod:`~cdc.stream.checkpoint`: which WAL position may be confirmed, from Kafka's acknowledgements;
  :mod:`~cdc.stream.confirm`: confirming it to the slot; :mod:`~cdc.stream.failures`: a failed delivery;
- :mod:`~cdc.stream.refusals`: records Kafka refuses, found and dead-lettered without reordering a key;
- :mod:`~cdc.stream.heartbeat`, :mod:`~cdc.stream.slot_watch`, :mod:`~cdc.stream.progress`: the idle slot,
  the other slots, the position saved for `cdc recover`;
- the run: :mod:`~cdc.stream.stream_loop` (the hot loop), :mod:`~cdc.stream.sessions` (start, reconnect,
  replay, shutdown), :mod:`~cdc.stream.waits`, :mod:`~cdc.stream.life` (the stream's one state) and
  :mod:`~cdc.stream.health`; :mod:`~cdc.stream.pipeline` composes them all.

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

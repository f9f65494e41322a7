"""The Avro wing: the event schemas and their wire formats, for the pipeline, the tools and the consumers.

- :mod:`~cdc.avro.store`: the schemas of ``schemas/<event_type>/v<N>.avsc``, loaded and cached;
- :mod:`~cdc.avro.encoder` (with :mod:`~cdc.avro.codegen`, :mod:`~cdc.avro.kinds`, :mod:`~cdc.avro.runtime`
  and :mod:`~cdc.avro.logical`, the JSON forms of logical types and bytes): a payload's JSON to Avro bytes,
  checked strictly, framed as single-object encoding or Confluent's;
- :mod:`~cdc.avro.python_values`: Python values (Decimal, datetime, bytes...) to those JSON forms, for
  ``cdc.outbox.emit``, and back, for the deserializer;
- :mod:`~cdc.avro.resolution` and :mod:`~cdc.avro.compat`: Avro's schema resolution rules and the
  compatibility modes between versions;
- :mod:`~cdc.avro.registry`: a Confluent-compatible schema registry client (imported on demand: its HTTP
  stack costs start-up time);
- :mod:`~cdc.avro.catalog`: the ``cdc schemas`` commands;
- :mod:`~cdc.avro.deserialize`: a Kafka record back to an event, for consumers.

It uses the base modules only (:mod:`cdc.config`, :mod:`cdc.errors`).
"""

from __future__ import annotations

from cdc.avro.deserialize import Event, EventDeserializer, KafkaMessage
from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import SchemaStore

__all__ = ["AvroEncoder", "Event", "EventDeserializer", "KafkaMessage", "SchemaStore"]

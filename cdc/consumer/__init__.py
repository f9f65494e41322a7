"""The consumer wing: what a downstream service runs to process outbox events exactly once.

Delivery into Kafka is at least once; :class:`IdempotentConsumer` makes processing exactly once by
recording each event id in the service's own database (:mod:`cdc.consumer.processed`) in the same
transaction as the handler's work, and commits Kafka offsets only after that transaction. A handler's
failure is classified (:mod:`cdc.consumer.failures`): retried with bounded backoff, or sent to the service's
dead-letter topic. :class:`EventDeserializer` (from the Avro wing) turns a record back into an event.

It uses the base modules and the Avro wing only: a service installs it without the pipeline.
"""

from __future__ import annotations

from cdc.avro.deserialize import Event, EventDeserializer, KafkaMessage
from cdc.consumer.failures import RetryPolicy, classify, dead_letter_headers
from cdc.consumer.idempotent import IdempotentConsumer
from cdc.consumer.records import BatchHandler, Handler
from cdc.consumer.session import consumer_config
from cdc.errors import PermanentError, RetriesExhaustedError, RetryableError

__all__ = [
    "BatchHandler",
    "Event",
    "EventDeserializer",
    "Handler",
    "IdempotentConsumer",
    "KafkaMessage",
    "PermanentError",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RetryableError",
    "classify",
    "consumer_config",
    "dead_letter_headers",
]

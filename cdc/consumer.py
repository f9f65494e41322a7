"""For the services downstream: read the pipeline's events."""

from __future__ import annotations

from cdc.deserialize import Event, EventDeserializer, KafkaMessage

__all__ = ["Event", "EventDeserializer", "KafkaMessage"]

"""Routes: per (aggregate type, event type, version) of the rows, the topic and the bound Avro encoder,
cached; and the schemas they are made from, re-read on a miss or at SIGHUP.

Owns the route cache (bounded: its keys are the rows' free text), the schema set (:mod:`cdc.avro.reload`),
the registry client when values are framed for a Confluent registry, and the metric series of each topic.
Making a route waits, with backoff, for a registry that does not answer and for a topic that is not there
yet (``retrying``, the pipeline's waits), and asks the publisher for a producer whose batches fit a topic
that takes less than the producer sends (``shrink_batches``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdc.avro.encoder import AvroEncoder, confluent_header
from cdc.avro.reload import SchemaSet
from cdc.config import Settings
from cdc.errors import (
    AggregateTypeNotAllowedError,
    CdcError,
    InvalidTopicError,
    RegistryUnavailableError,
    SchemaNotFoundError,
    TopicMissingError,
)
from cdc.stream.route import EventRouter, Route
from cdc.stream.sink import KafkaSink

if TYPE_CHECKING:
    from cdc.avro.registry import SchemaRegistry

Retrying = Callable[[Callable[[], Any], type[CdcError], str, str], Any]

# The route cache and the metric series are keyed by values the rows bring: bounded, so that a stream of new
# aggregate types (a bug upstream, or an allow-list left off) cannot grow the process without end.
MAX_ROUTES = 10_000
MAX_TOPIC_SERIES = 1_000
OTHER_TOPICS = "(other topics)"


class Routes:
    def __init__(
        self,
        settings: Settings,
        router: EventRouter,
        sink: KafkaSink,
        *,
        compiled: bool,
        retrying: Retrying,
        shrink_batches: Callable[[str, int], None],
    ) -> None:
        self._settings = settings
        self._router = router
        self._sink = sink
        # Checked as `cdc schemas check` does (a ConfigError when it fails), re-read on a miss or SIGHUP.
        self.schemas = SchemaSet(settings.schemas_dir, settings.schema_compatibility, compiled=compiled)
        self.encoder: AvroEncoder = self.schemas.encoder
        self.registry: SchemaRegistry | None = None
        if settings.value_format == "confluent":
            # Imported only here: the registry client's HTTP stack costs start-up time and ~15 MB of RSS.
            from cdc.avro.registry import SchemaRegistry

            self.registry = SchemaRegistry.from_settings(settings, self.schemas.store)
        self.cache: dict[tuple[bytes, bytes, bytes], Route] = {}
        # Events handed to Kafka, by metric series (a topic, or one for all past MAX_TOPIC_SERIES).
        self.published: defaultdict[str, int] = defaultdict(int)
        self.reload_requested = False
        self._retrying = retrying  # the pipeline's waits: a registry or topic that is not there yet
        self._shrink = shrink_batches  # the publisher's: a producer whose batches fit a topic

    def route(self, aggregate_type: bytes, event_type: bytes, version: bytes) -> Route:
        """Topic and bound encoder of one (aggregate type, event type, version); cached when it works."""
        try:
            at, et = aggregate_type.decode(), event_type.decode()
        except UnicodeDecodeError:
            raise InvalidTopicError(
                "the aggregate type or event type is not UTF-8: it makes no topic"
            ) from None
        allowed = self._settings.aggregate_types
        if allowed is not None and at not in allowed:
            raise AggregateTypeNotAllowedError(
                f"aggregate type {at[:60]!r} is not in the aggregate_types allow-list"
            )
        v = int(version)
        topic = self._router.topic(at, et)
        try:  # the schema first: a missing one is the event's fault, once schemas_dir was re-read
            encode = self.encoder.encoder_for(et, v)
        except SchemaNotFoundError:
            self.reload((et, v))
            encode = self.encoder.encoder_for(et, v)  # or the error again, saying what the re-read found
        registry = self.registry
        if registry is not None:
            schema_id = self._retrying(
                lambda: registry.schema_id(topic, et, v),
                RegistryUnavailableError,
                "the schema registry",
                f"the schema registry answers again ({et} v{v})",
            )
            encode = self.encoder.encoder_for(et, v, header=confluent_header(schema_id))
        self.ensure_topic(topic)
        sink = self._sink
        limit = sink.record_limit(topic)
        if limit is not None and not sink.batches_fit(limit):
            self._shrink(topic, limit)
        cache = self.cache
        if len(cache) >= MAX_ROUTES:
            del cache[next(iter(cache))]  # the oldest: a route is cheap to make again
        published = self.published
        series = topic if topic in published or len(published) < MAX_TOPIC_SERIES else OTHER_TOPICS
        published.setdefault(series, 0)
        route = cache[(aggregate_type, event_type, version)] = (topic, encode, series, limit)
        return route

    def ensure_topic(self, topic: str) -> None:
        self._retrying(
            lambda: self._sink.ensure_topic(topic),
            TopicMissingError,
            f"topic {topic}",
            f"topic {topic} exists now",
        )

    def topic_or_none(self, aggregate_type: bytes, event_type: bytes) -> str:
        """The topic a dead-lettered event was meant for, or "" when its names make none."""
        try:
            return self._router.topic(aggregate_type.decode(), event_type.decode())
        except (InvalidTopicError, UnicodeDecodeError):
            return ""

    def forget(self) -> None:
        """Every route made again: topic limits are read again (a refusal may mean they changed)."""
        self.cache.clear()

    def request_reload(self) -> None:
        """Re-read schemas_dir between two reads of the stream (safe from a signal handler: SIGHUP)."""
        self.reload_requested = True

    def reload_now(self) -> None:
        self.reload_requested = False
        self.reload()

    def reload(self, missing: tuple[str, int] | None = None) -> bool:
        """Re-read schemas_dir: throttled for a ``missing`` (event type, version), else at once (SIGHUP);
        True when new schemas are in use. Cached routes stay valid: a re-read that changes a loaded version
        is refused."""
        schemas = self.schemas
        changed = schemas.reload_on_miss(*missing) if missing is not None else schemas.reload("SIGHUP")
        if changed:
            self.encoder = schemas.encoder
            if self.registry is not None:
                self.registry.store = schemas.store
        return changed

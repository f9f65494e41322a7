"""The pipeline, assembled: ``Pipeline(settings).run()`` streams the outbox into Kafka until a stop.

This is the one place where the parts are made and given to each other, and where the choices are made once:
the delivery mode picks the publisher (:class:`~cdc.stream.publisher.AtLeastOnce` or
:class:`~cdc.stream.exactly_once.ExactlyOnce`), the installation picks the compiled hot path or Python.

```
 source ──▶ StreamLoop ──▶ Emitter ──▶ Routes (topic, encoder) ──▶ Sender ──▶ KafkaSink ──▶ Kafka
   ▲           │  │           └──▶ DeadLetters (reasons, flood brake)          │ reports
   │           │  └──▶ Publisher (at-least-once | exactly-once)               ▼
   └─ Confirmer ◀──── what may be confirmed ◀──── Acks (AckTracker) ◀── DeliveryFailures
 Sessions: start, sessions, reconnect, replay, shutdown      Waits: backoff, sleeping, queue emptied
 Life: Starting · Standby · Streaming · Waiting · Reconnecting · Draining · Stopped  (read by Health)
```

Each part owns its state and gets what it needs here; none reaches into another. What a part needs of one
made after it comes as a callable that closes over the later part (made before the first call).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from cdc import fastpath
from cdc.avro.reload import SchemaSet
from cdc.config import Settings
from cdc.errors import format_lsn
from cdc.stream.checkpoint import AckLatency, Acks, AckTracker, SourceTransaction
from cdc.stream.confirm import Confirmer
from cdc.stream.deadletters import DeadLetters, delivery_log
from cdc.stream.emit import Emitter
from cdc.stream.exactly_once import ExactlyOnce
from cdc.stream.failures import DeliveryFailures
from cdc.stream.health import Health
from cdc.stream.heartbeat import Heartbeat
from cdc.stream.life import Life, Standby, Starting
from cdc.stream.progress import PositionWriter
from cdc.stream.publisher import AtLeastOnce, Publisher
from cdc.stream.refusals import RefusalLedger
from cdc.stream.route import EventRouter
from cdc.stream.routes import Routes
from cdc.stream.sender import Sender
from cdc.stream.sessions import Sessions
from cdc.stream.sink import Headers, KafkaSink
from cdc.stream.slot_watch import SlotWatch
from cdc.stream.stream_loop import StreamLoop
from cdc.stream.waits import Waits
from cdc.tracing import start as start_tracing

log = logging.getLogger("cdc.pipeline")

STARTING_STOP_SECONDS = 1.0  # a stop during start-up, before anything was produced: the process ends within


class Pipeline:
    """The outbox stream, from the slot to Kafka."""

    def __init__(
        self,
        settings: Settings,
        *,
        sink: KafkaSink | None = None,
        accept_partitioner_change: bool = False,
        extra_headers: Headers | None = None,
    ) -> None:
        self.settings = s = settings
        compiled = fastpath.enabled(s.fast_path)
        self.life = life = Life()
        self.acks = acks = Acks()
        self.sink = sink = sink or KafkaSink(s)
        self.router = router = EventRouter(s, compiled=compiled)
        refusals = RefusalLedger()
        current = SourceTransaction()
        headers = extra_headers or []
        self.failures = failures = DeliveryFailures(s, sink, acks)
        self.heartbeat = heartbeat = Heartbeat(s)
        self.slot_watch = slot_watch = SlotWatch(s)  # other slots created or dropped on the cluster
        position = PositionWriter(s)  # for `cdc recover`: how far Kafka acknowledged the outbox
        # Tracing (issue 40): OpenTelemetry's SDK from the OTEL_* variables, or None (off, or not installed).
        self.tracing = tracing = start_tracing(s.tracing, compiled=compiled)
        publisher: Publisher
        # The parts below call each other through these, bound once every part exists.
        confirmer: Confirmer
        waits: Waits
        loop: StreamLoop

        def keep_alive() -> None:
            confirmer.keep_alive()

        def until_empty() -> None:
            waits.until_empty()

        def end_spans(spans: list[Any], committed: bool) -> None:
            from cdc.stream.spans import end_all

            end_all(spans, committed=committed)

        if s.delivery == "exactly-once":
            publisher = ExactlyOnce(
                s,
                sink,
                acks,
                keep_alive=keep_alive,
                pending_failure=failures.pending,
                shutdown_left=lambda: waits.shutdown_left() if life.stopping else None,
                end_spans=end_spans,
            )
        else:
            publisher = AtLeastOnce(sink, until_empty)
        self.publisher = publisher
        confirmer = Confirmer(
            acks,
            life,
            position,
            refusals,
            status_interval=s.status_interval,
            confirmable=publisher.confirmable,
            check=failures.check,
            received=lambda: loop.received,
        )
        self.confirmer = confirmer
        waits = Waits(
            settings=s,
            sink=sink,
            life=life,
            keep_alive=confirmer.keep_alive,
            check=failures.check,
            acked_events=lambda: acks.tracker.acked_events,
        )
        self.routes = routes = Routes(
            s,
            router,
            sink,
            compiled=compiled,
            retrying=waits.retrying,
            shrink_batches=publisher.shrink_batches,
        )
        spans = None
        if tracing is not None:
            from cdc.stream.spans import RelaySpans  # OpenTelemetry is an optional extra

            spans = RelaySpans(tracing, track=publisher.track)
        sender = Sender(
            sink, refusals, current, until_empty=until_empty, keep_alive=keep_alive, fail=failures.fail
        )
        self.dead_letters = dead_letters = DeadLetters(
            s,
            sink,
            sender,
            current,
            ensure_topic=routes.ensure_topic,
            extra_headers=headers,
            trace=delivery_log.isEnabledFor(logging.DEBUG),
            spans=spans,
        )
        self.emitter = emitter = Emitter(
            router,
            routes,
            sink,
            sender,
            dead_letters,
            refusals,
            current,
            keep_alive=keep_alive,
            fail=failures.fail,
            extra_headers=headers,
            spans=spans,
        )
        loop = StreamLoop(
            life=life,
            acks=acks,
            router=router,
            routes=routes,
            emitter=emitter,
            publisher=publisher,
            sink=sink,
            confirmer=confirmer,
            failures=failures,
            dead_letters=dead_letters,
            heartbeat=heartbeat,
            slot_watch=slot_watch,
        )
        self.loop = loop

        def finish(confirmed: int) -> None:
            position.offer(float("inf"), confirmed, acks.tracker.last_outbox)
            position.close()
            if tracing is not None:  # what is queued, within what is left of shutdown_timeout
                tracing.shutdown(max(0.5, waits.shutdown_left()))
            self._report()

        self.sessions = Sessions(
            settings=s,
            life=life,
            acks=acks,
            sink=sink,
            routes=routes,
            publisher=publisher,
            loop=loop,
            confirmer=confirmer,
            refusals=refusals,
            sender=sender,
            waits=waits,
            failures=failures,
            closing=[heartbeat, slot_watch],
            finish=finish,
            flood=lambda: dead_letters.flood,
            accept_partitioner_change=accept_partitioner_change,
        )
        self.health = Health(s, life, sink, confirmer)

    # -- control (the CLI; safe from signal handlers) ------------------------------------------------------

    def run(self) -> None:
        """Stream until a stop is requested; raise a CdcError when the pipeline cannot go on."""
        self.sessions.run()

    def request_stop(self) -> float:
        """Ask the pipeline to stop reading and shut down gracefully; returns the seconds the process may
        still take: shutdown_timeout, or STARTING_STOP_SECONDS while it has not streamed yet (nothing was
        produced, so nothing is in flight)."""
        self.life.request_stop()
        if isinstance(self.life.state, Starting | Standby):
            return STARTING_STOP_SECONDS
        return self.settings.shutdown_timeout

    def request_schema_reload(self) -> None:
        """Re-read schemas_dir between two reads of the stream (SIGHUP)."""
        self.routes.request_reload()

    # -- what the metrics and the probes read --------------------------------------------------------------

    def not_ready(self) -> list[str]:
        return self.health.not_ready()

    def alive(self) -> str | None:
        return self.health.alive()

    def seconds_since_server_message(self) -> float | None:
        return self.health.seconds_since_server_message()

    def dead_letters_in_window(self) -> int:
        return self.dead_letters.in_window()

    @property
    def standing_by(self) -> bool:
        """A standby waiting for the slot (on_slot_active = wait): not ready, by design."""
        return isinstance(self.life.state, Standby)

    @property
    def tracker(self) -> AckTracker:
        return self.acks.tracker

    @property
    def latency(self) -> AckLatency:
        return self.acks.latency

    @property
    def schemas(self) -> SchemaSet:
        return self.routes.schemas

    @property
    def published_by_topic(self) -> defaultdict[str, int]:
        return self.routes.published

    @property
    def dead_lettered_by_reason(self) -> defaultdict[str, int]:
        return self.dead_letters.by_reason

    @property
    def events_published(self) -> int:
        return sum(self.routes.published.values())

    @property
    def events_dead_lettered(self) -> int:
        return self.dead_letters.total

    @property
    def delivery_errors(self) -> int:
        return self.failures.count

    @property
    def reconnects(self) -> int:
        return self.sessions.reconnects

    @property
    def refusal_replays(self) -> int:
        return self.sessions.replays

    @property
    def ignored_messages(self) -> int:
        return self.loop.ignored_messages

    @property
    def server_wal_end(self) -> int:
        return self.loop.server_wal_end

    @property
    def kafka_commits(self) -> int:
        return self.publisher.commits

    @property
    def kafka_aborts(self) -> int:
        return self.publisher.aborts

    @property
    def skipped_transactions(self) -> int:
        return self.publisher.skipped

    def _report(self) -> None:
        log.info(
            "stopped: %d events published, %d dead-lettered, confirmed LSN %s",
            self.events_published,
            self.events_dead_lettered,
            format_lsn(self.confirmer.confirmable()),
        )
        if self.settings.delivery == "exactly-once":
            log.info(
                "exactly-once: %d Kafka transactions committed, %d aborted, %d source transactions skipped",
                self.kafka_commits,
                self.kafka_aborts,
                self.skipped_transactions,
            )
        latency = self.acks.latency
        if latency.total:
            log.info(
                "commit-to-ack over %d events: p50 %s ms, p99 %s ms, max %d ms",
                latency.total,
                latency.percentile(0.5),
                latency.percentile(0.99),
                latency.max_ms,
            )

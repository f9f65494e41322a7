"""What ``/metrics`` says of the pipeline: the families read from its parts at a scrape (counters the stream's
thread keeps as it goes, its state, its acknowledgement latency), on the metrics server's thread. Reading ints
and a list the stream's thread writes is safe under the GIL, and a scrape that is one event behind is fine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cdc.stream.pipeline import Pipeline

# Upper bounds (ms) of the commit-to-ack histogram's buckets.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


class PipelineCollector(Collector):
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Any]:
        p = self.pipeline
        published = CounterMetricFamily(
            "cdc_events_published", "Events handed to Kafka, by topic", labels=["topic"]
        )
        for topic, count in list(p.published_by_topic.items()):
            published.add_metric([topic], count)
        yield published
        dead = CounterMetricFamily(
            "cdc_dead_letter_events", "Events sent to the dead-letter topic", labels=["reason"]
        )
        for reason, count in list(p.dead_lettered_by_reason.items()):
            dead.add_metric([reason], count)
        yield dead
        yield CounterMetricFamily("cdc_delivery_errors", "Deliveries Kafka refused", value=p.delivery_errors)
        yield CounterMetricFamily("cdc_reconnects", "Reconnections to PostgreSQL", value=p.reconnects)
        kafka_txns = CounterMetricFamily(
            "cdc_kafka_transactions",
            "Kafka transactions of delivery = exactly-once, by outcome",
            labels=["outcome"],
        )
        kafka_txns.add_metric(["committed"], p.kafka_commits)
        kafka_txns.add_metric(["aborted"], p.kafka_aborts)
        yield kafka_txns
        yield CounterMetricFamily(
            "cdc_skipped_source_transactions",
            "Source transactions skipped because a committed checkpoint covers them (exactly-once)",
            value=p.skipped_transactions,
        )
        yield CounterMetricFamily(
            "cdc_refusal_replays",
            "Times Kafka refused records and the stream was replayed to dead-letter the culprit",
            value=p.refusal_replays,
        )
        yield CounterMetricFamily(
            "cdc_ignored_outbox_messages",
            "Non-transactional 'outbox' logical messages, which are not events",
            value=p.ignored_messages,
        )
        yield GaugeMetricFamily(
            "cdc_confirmed_lsn", "LSN confirmed to the slot", value=p.tracker.confirmed_lsn
        )
        yield GaugeMetricFamily(
            "cdc_replication_lag_bytes",
            "Server WAL end (last keepalive or message) minus the confirmed LSN",
            value=max(0, p.server_wal_end - p.tracker.confirmed_lsn),
        )
        yield GaugeMetricFamily(
            "cdc_producer_queue_depth", "Records waiting for Kafka", value=p.sink.queue_depth()
        )
        if p.slot_watch.count is not None:
            yield GaugeMetricFamily(
                "cdc_replication_slots",
                "Replication slots on the cluster, ours included, at the pipeline's last look",
                value=p.slot_watch.count,
            )
        yield CounterMetricFamily(
            "cdc_replication_slot_changes",
            "Replication slots created or dropped on the cluster since the pipeline started (each is logged)",
            value=p.slot_watch.changes,
        )
        silent = p.seconds_since_server_message()
        if silent is not None:  # not streaming: no value (cdc_ready says why)
            yield GaugeMetricFamily(
                "cdc_seconds_since_last_server_message",
                "Seconds since PostgreSQL's replication stream last sent anything (data or keepalive)",
                value=silent,
            )
        yield GaugeMetricFamily(
            "cdc_in_flight_events", "Events produced, not yet acknowledged", value=p.tracker.in_flight
        )
        state = GaugeMetricFamily(
            "cdc_pipeline_state",
            "The stream's life: 1 for its state now (starting, standby, streaming, waiting, reconnecting, "
            "draining, stopped), 0 for the others",
            labels=["state"],
        )
        for name, value in p.life.gauge().items():
            state.add_metric([name], value)
        yield state
        yield GaugeMetricFamily(
            "cdc_compiled_hot_path",
            "1: outbox rows are read and encoded by the compiled extension (fast_path); 0: by Python alone",
            value=int(p.schemas.compiled),
        )
        yield CounterMetricFamily(
            "cdc_heartbeats_seen", "Heartbeat messages read back from the stream", value=p.heartbeat.seen
        )
        yield GaugeMetricFamily(
            "cdc_last_heartbeat_seen_timestamp_seconds",
            "Unix time the last heartbeat came back on the stream (0: none yet)",
            value=p.heartbeat.last_seen,
        )
        yield GaugeMetricFamily(
            "cdc_dead_letter_brake_limit",
            "max_dead_letters: dead letters within dead_letter_window that stop the run (0: off)",
            value=p.settings.max_dead_letters or 0,
        )
        yield GaugeMetricFamily(
            "cdc_dead_letters_in_window",
            "Dead letters within the last dead_letter_window, as the brake counts them (0 when it is off)",
            value=p.dead_letters_in_window(),
        )
        reloads = CounterMetricFamily(
            "cdc_schema_reloads",
            "Re-reads of schemas_dir (a miss or SIGHUP), by outcome: used, unchanged, refused",
            labels=["outcome"],
        )
        for outcome, count in list(p.schemas.reloads.items()):
            reloads.add_metric([outcome], count)
        yield reloads
        yield _latency_histogram(p)


def _latency_histogram(p: Pipeline) -> HistogramMetricFamily:
    counts = p.latency.counts
    buckets: list[tuple[str, float]] = []
    running = 0
    previous = 0
    for bound in LATENCY_BUCKETS_MS:
        running += sum(counts[previous : bound + 1])
        previous = bound + 1
        buckets.append((str(bound / 1000), running))
    buckets.append(("+Inf", p.latency.total))
    return HistogramMetricFamily(
        "cdc_commit_to_ack_seconds",
        "Commit-to-ack latency, per event (its transaction's last acknowledgement)",
        buckets=buckets,
        sum_value=p.latency.sum_ms / 1000,
    )

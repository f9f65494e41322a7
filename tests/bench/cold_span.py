"""What one sampled event's span costs the relay's thread when its code runs cold, as at 1% sampled.

`python -m tests.bench.cold_span`: the relay's span code (``RelaySpans.start``, ``delivered`` and the
delivery report, which queues the span for export) timed alone, once in a loop of spans (warm) and once after
a few MB of other work each time (cold: the caches hold the rest of the loop, as between two sampled events
of a hundred). ``make bench``'s tracing phase measures the whole relay; this one its span code alone, in
seconds, to compare two versions of it (figures: docs/operations.md, "Tracing"). Spans are queued, never
exported: the exporter's thread is not in it. ``--python`` leaves the compiled extension's part out.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from confluent_kafka import Message
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from cdc import fastpath
from cdc.stream.spans import RelaySpans
from cdc.trace_processor import BoundedProcessor, Tracing
from cdc.trace_stats import SpanStats


class Nowhere(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def relay(compiled: bool) -> RelaySpans:
    provider = TracerProvider(resource=Resource.create({"service.name": "cold-span"}))
    processor = BoundedProcessor(Nowhere(), 1 << 20, SpanStats())
    processor._batch_size = 1 << 30  # never woken: nothing but this thread runs
    provider.add_span_processor(processor)
    extension = fastpath.extension if compiled else None
    tracing = Tracing(
        "row-context-only",
        provider,
        processor,
        name="cold-span",
        plain_child=getattr(extension, "plain_child", None),
    )
    return RelaySpans(tracing, track=lambda span: True)


def timed(spans: RelaySpans, rng: random.Random, other: bytearray | None) -> tuple[int, int, int]:
    """One event's span, in ns: its start, its delivery callback made, its delivery report noted."""
    traceparent = b"00-%032x-%016x-01" % (rng.getrandbits(128) | 1, rng.getrandbits(64) | 1)
    row = (("traceparent", traceparent),)
    headers = [("id", b"e-1"), ("event_type", b"OrderPlaced"), ("schema_version", b"1"), *row]
    report = Message(topic="app.order", partition=3, offset=12345)
    if other is not None:
        for i in range(0, len(other), 64):  # a cache line each: the rest of a hundred events' work
            other[i] ^= 1
    clock = time.perf_counter_ns
    t0 = clock()
    started = spans.start(headers, row, "app.order", b"o-1", b"e-1", b"OrderPlaced", b"1", b"0/3E8", 1)
    t1 = clock()
    assert started is not None
    acknowledged = spans.delivered(started[0], lambda err, msg: None)
    t2 = clock()
    acknowledged(None, report)
    t3 = clock()
    return t1 - t0, t2 - t1, t3 - t2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=3000, help="spans per pass (default 3000)")
    parser.add_argument("--other-mb", type=float, default=3.0, help="work between two cold spans, in MB")
    parser.add_argument("--python", action="store_true", help="without the compiled extension's part")
    args = parser.parse_args(argv)
    spans = relay(compiled=not args.python)
    rng = random.Random(1)
    other = bytearray(int(args.other_mb * 2**20))
    for name, between in (("warm", None), ("cold", other), ("warm", None), ("cold", other)):
        runs = [timed(spans, rng, between) for _ in range(args.spans)]
        parts = [statistics.median(run[k] for run in runs) / 1000 for k in range(3)]
        total = statistics.median(sum(run) for run in runs) / 1000
        print(
            f"{name}: {total:.2f} µs a span (start {parts[0]:.2f}, delivered {parts[1]:.2f}, "
            f"delivery report {parts[2]:.2f})"
        )


if __name__ == "__main__":
    main()

"""The pure parts of `make bench-debezium`: the Connect files each Debezium variant runs with, and the figures
and table it prints. A wrong mapping here would measure a relay that does not do the same job."""

from __future__ import annotations

import argparse

import pytest

from tests.bench.debezium import config as dbz
from tests.bench.debezium.cli import RELAYS, default_connect_port, parse_args, parse_relays
from tests.bench.debezium.jars import parse_java_major
from tests.bench.table import figures, markdown

DATABASE = dbz.Database(host="127.0.0.1", port=24432, user="postgres", password="s3cret", dbname="bench")


def connector(name: str) -> dict[str, str]:
    return dbz.connector_config(
        dbz.VARIANTS[name],
        database=DATABASE,
        slot="bench_slot",
        publication="bench_outbox",
        table="public.outbox",
        topic_prefix="bench.r1.debezium-default",
    )


def worker(name: str, registry: str | None = "http://127.0.0.1:24081/apis/registry/v2") -> dict[str, str]:
    return dbz.worker_config(
        dbz.VARIANTS[name],
        bootstrap="127.0.0.1:24092",
        offsets_file="/tmp/x/default.offsets",
        rest_port=24095,
        registry_url=registry,
    )


def parse_properties(text: str) -> dict[str, str]:
    """Enough of java.util.Properties to read back what render_properties writes."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        chars, i = [], 0
        while i < len(value):
            if value[i] == "\\":
                i += 1
                chars.append({"n": "\n", "r": "\r", "t": "\t"}.get(value[i], value[i]))
            else:
                chars.append(value[i])
            i += 1
        out[key] = "".join(chars)
    return out


def test_the_event_router_is_mapped_to_the_columns_of_cdc_setup():
    c = connector("default")
    assert c["transforms"] == "outbox"
    assert c["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    assert c["transforms.outbox.table.field.event.id"] == "id"
    assert c["transforms.outbox.table.field.event.key"] == "aggregate_id"
    assert c["transforms.outbox.table.field.event.payload"] == "payload"
    assert c["transforms.outbox.table.field.event.type"] == "event_type"
    assert c["transforms.outbox.route.by.field"] == "aggregate_type"
    assert c["transforms.outbox.route.topic.replacement"] == "bench.r1.debezium-default.${routedByValue}"


def test_the_connector_streams_its_own_slot_of_the_existing_publication_and_reads_no_table_data():
    c = connector("default")
    assert (c["plugin.name"], c["slot.name"], c["publication.name"]) == (
        "pgoutput",
        "bench_slot",
        "bench_outbox",
    )
    assert c["publication.autocreate.mode"] == "disabled"
    assert c["snapshot.mode"] == "no_data"
    assert c["table.include.list"] == "public.outbox"
    assert (c["database.hostname"], c["database.port"], c["database.dbname"]) == (
        "127.0.0.1",
        "24432",
        "bench",
    )
    assert "." not in c["topic.prefix"]


def test_default_keeps_every_default_and_writes_the_payload_as_text():
    c, w = connector("default"), worker("default")
    for key in (
        "poll.interval.ms",
        "max.batch.size",
        "max.queue.size",
        "transforms.outbox.table.expand.json.payload",
    ):
        assert key not in c
    assert not any(k.startswith("producer.") for k in w)
    assert w["key.converter"] == w["value.converter"] == dbz.STRING_CONVERTER
    assert w["listeners"] == "http://127.0.0.1:24095"
    assert w["offset.storage.file.filename"] == "/tmp/x/default.offsets"


def test_tuned_sets_what_the_issue_tuned():
    c, w = connector("tuned"), worker("tuned")
    assert (c["poll.interval.ms"], c["max.batch.size"], c["max.queue.size"]) == ("10", "8192", "65536")
    assert w["producer.max.in.flight.requests.per.connection"] == "5"
    assert w["producer.batch.size"] == str(1024 * 1024)
    assert w["value.converter"] == dbz.STRING_CONVERTER


def test_avro_is_tuned_with_the_payload_expanded_into_confluent_framed_avro():
    c, w = connector("avro"), worker("avro")
    assert c["transforms.outbox.table.expand.json.payload"] == "true"
    assert c["poll.interval.ms"] == "10" and w["producer.batch.size"] == str(1024 * 1024)
    assert w["value.converter"] == dbz.APICURIO_AVRO_CONVERTER
    assert w["key.converter"] == dbz.STRING_CONVERTER
    assert w["value.converter.apicurio.registry.url"] == "http://127.0.0.1:24081/apis/registry/v2"
    assert w["value.converter.apicurio.registry.as-confluent"] == "true"
    assert w["value.converter.apicurio.registry.use-id"] == "contentId"
    assert w["value.converter.apicurio.registry.headers.enabled"] == "false"


def test_the_avro_variant_refuses_to_run_without_a_registry():
    with pytest.raises(ValueError, match="registry"):
        worker("avro", registry=None)


def test_properties_round_trip_and_keep_what_the_format_would_eat():
    config = {"a.b": "x=y:z", "path": "C:\\dir\\file", "lead": "  two spaces", "lines": "1\n2", "empty": ""}
    assert parse_properties(dbz.render_properties(config)) == config


def test_a_property_name_the_format_cannot_carry_is_refused():
    with pytest.raises(ValueError, match="property name"):
        dbz.render_properties({"a b": "1"})


def test_passwords_are_redacted_for_the_results_file():
    assert dbz.redacted(connector("default"))["database.password"] == "***"
    assert dbz.redacted({"x": "1"}) == {"x": "1"}


def test_the_registry_api_sits_beside_the_confluent_compatible_one():
    assert (
        dbz.registry_api("http://127.0.0.1:28081/apis/ccompat/v7")
        == "http://127.0.0.1:28081/apis/registry/v2"
    )
    with pytest.raises(ValueError):
        dbz.registry_api("http://127.0.0.1:8081")


def test_java_versions_are_read_old_and_new():
    assert parse_java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_major('java version "1.8.0_392"') == 8
    assert parse_java_major('openjdk version "25" 2025-09-16') == 25
    assert parse_java_major("command not found") == 0


def test_rate_is_over_the_arrival_span_and_cpu_over_the_events_between_the_polls():
    f = figures(
        events=500_000,
        first_ms=1_000,
        last_ms=11_000,
        relay_cpu_s=4.0,
        walsender_cpu_s=3.0,
        window_events=400_000,
    )
    assert f["events_per_s"] == 50_000
    assert f["arrival_span_s"] == 10.0
    assert f["cpu_us_per_event"] == 10.0  # 4 s over the 400 000 events counted, not over all 500 000
    assert f["walsender_cpu_us_per_event"] == 6.0  # all the walsender spent, over all events


def test_no_cpu_figure_when_no_event_arrived_between_the_polls():
    f = figures(events=100, first_ms=5, last_ms=5, relay_cpu_s=0.0, walsender_cpu_s=None, window_events=0)
    assert f["events_per_s"] is None
    assert f["cpu_us_per_event"] is None
    assert f["walsender_cpu_us_per_event"] is None


def test_the_table_relates_every_rate_to_the_bare_reader():
    runs = [
        {"relay": "bare", "label": "bare", "events_per_s": 92_040, "cpu_us_per_event": 5.2,
         "walsender_cpu_us_per_event": 10.8, "peak_rss_mb": None},
        {"relay": "cdc", "label": "`cdc run`", "events_per_s": 64_130, "cpu_us_per_event": 14.7,
         "walsender_cpu_us_per_event": 5.6, "peak_rss_mb": 76.4},
        {"relay": "debezium-default", "label": "Debezium", "events_per_s": 20_890, "cpu_us_per_event": 73.5,
         "walsender_cpu_us_per_event": None, "peak_rss_mb": 2109.0},
        {"relay": "debezium-avro", "label": "Avro", "ok": False, "error": "10 of 20 records"},
    ]  # fmt: skip
    assert markdown(runs) == [
        "| relay | events/s | vs bare drain | CPU µs/event | peak RSS |",
        "|---|---|---|---|---|",
        "| bare | 92,000 | 1.00 | 5.2 (walsender 10.8) | - |",
        "| `cdc run` | 64,100 | 0.70 | 14.7 (walsender 5.6) | 76 MB |",
        "| Debezium | 20,900 | 0.23 | 73.5 | 2.06 GB |",
        "| Avro (FAILED: 10 of 20 records) | n/a | n/a | n/a | - |",
    ]


def test_without_the_bare_reader_there_is_no_ratio():
    runs = [{"relay": "cdc", "label": "c", "events_per_s": 1_000, "cpu_us_per_event": None, "peak_rss_mb": 5}]
    assert markdown(runs)[2] == "| c | 1,000 | n/a | n/a | 5 MB |"


def test_relays_are_chosen_by_name_in_the_order_given():
    assert parse_relays("cdc, debezium-avro") == ["cdc", "debezium-avro"]
    assert RELAYS == ("bare", "cdc", "debezium-default", "debezium-tuned", "debezium-avro")
    for bad in ("", "cdc,debezium", "kafka"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_relays(bad)


def test_connects_rest_port_sits_beside_the_stacks_kafka_unless_set():
    assert default_connect_port({"CDC_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:24092"}) == 24095
    assert default_connect_port({"CDC_BENCH_CONNECT_PORT": "24199"}) == 24199
    assert default_connect_port({}) == 29095


def test_arguments_are_checked():
    env = {"CDC_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:24092"}
    args = parse_args([], env)
    assert (args.events, args.rows_per_txn, args.relays, args.connect_port) == (
        500_000,
        100,
        list(RELAYS),
        24095,
    )
    assert parse_args(["--events", "20000"], env).events == 20_000
    for bad in (["--events", "150"], ["--events", "0"], ["--connect-port", "40000"]):
        with pytest.raises(SystemExit):
            parse_args(bad, env)

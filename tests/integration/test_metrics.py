"""Observability against the real stack: /metrics, /healthz, /readyz, and no secret or payload anywhere."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

from psycopg.conninfo import conninfo_to_dict

from tests.plugins.pipeline import cdc, free_port, order_placed, wait_until

MARKER = "PAYLOAD-MARKER-7f3a"


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name}{labels} not in /metrics:\n{text}"
    return float(found.group(1))


def test_metrics_health_and_readiness_and_nothing_secret_leaks(outbox, pipeline_process):
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port))
    wait_until(lambda: get(port, "/healthz")[0] == 200, 30, "/healthz")
    proc.wait_streaming()
    assert get(port, "/readyz") == (200, "ready\n")

    good = [outbox.event(f"m-{i}", order_placed(f"{MARKER}-{i}")) for i in range(5)]
    bad = outbox.event("m-bad", order_placed(f"{MARKER}-bad", amount_cents=MARKER))
    txn = outbox.commit([*good, bad])
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the events confirmed")

    def scraped() -> str:
        status, text = get(port, "/metrics")
        assert status == 200
        return text

    topic = outbox.topic("order")
    text = wait_until(
        lambda: (t := scraped()) and "cdc_commit_to_ack_seconds_count" in t and t, 10, "a complete scrape"
    )
    assert metric(text, "cdc_events_published_total", f'{{topic="{topic}"}}') == 5
    assert metric(text, "cdc_dead_letter_events_total", '{reason="payload_invalid"}') == 1
    assert metric(text, "cdc_confirmed_lsn") >= txn.lsn_before
    assert metric(text, "cdc_commit_to_ack_seconds_count") == 6
    assert metric(text, "cdc_commit_to_ack_seconds_bucket", '{le="+Inf"}') == 6
    assert metric(text, "cdc_delivery_errors_total") == 0
    assert metric(text, "cdc_producer_queue_depth") == 0
    assert metric(text, "cdc_replication_lag_bytes") >= 0
    # `make install` builds the compiled extension wherever cargo is, as in CI: the run says it uses it.
    assert metric(text, "cdc_compiled_hot_path") == 1
    assert "hot path: compiled (cdc._fastpath" in proc.log()
    assert get(port, "/nope")[0] == 404

    assert proc.terminate() == 0
    password = conninfo_to_dict(outbox.dsn).get("password")
    assert password, "the test needs a DSN with a password to prove it is never shown"
    shown = cdc(outbox.env, "config", "show").stdout + cdc(outbox.env, "config", "show", "--json").stdout
    for where, output in (("the log", proc.log()), ("/metrics", text), ("cdc config show", shown)):
        assert password not in output, f"the database password appears in {where}"
        assert MARKER not in output, f"a payload value appears in {where}"


def test_readyz_says_when_kafka_does_not_answer(outbox, private_kafka, pipeline_process):
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port), CDC_KAFKA_BOOTSTRAP_SERVERS=private_kafka.bootstrap)
    proc.wait_streaming()
    wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "ready")
    private_kafka.stop()
    status, body = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, 60, "not ready")
    assert body == "Kafka does not answer\n"
    assert get(port, "/healthz")[0] == 200, "alive all the same"
    private_kafka.start()
    wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "ready again")
    assert proc.terminate() == 0


def test_a_slot_created_or_dropped_on_the_cluster_is_logged_and_counted(
    outbox, pipeline_process, unique_name
):
    """Any role with REPLICATION may create or drop a slot (there is no finer right): the pipeline says so."""
    port = free_port()
    proc = pipeline_process(CDC_METRICS_PORT=str(port))
    proc.wait_for_log(r"replication slots on the cluster besides ours", 30)
    assert metric(get(port, "/metrics")[1], "cdc_replication_slot_changes_total") == 0
    other = unique_name("intruder")[:63]
    outbox.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (other,))
    try:
        proc.wait_for_log(rf"replication slot {other} \(pgoutput, database \S+\) was created", 30)
    finally:
        outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (other,))
    proc.wait_for_log(rf"replication slot {other} \(pgoutput, database \S+\) was dropped", 30)
    text = get(port, "/metrics")[1]
    assert metric(text, "cdc_replication_slot_changes_total") == 2
    assert metric(text, "cdc_replication_slots") >= 1
    assert proc.terminate() == 0


def test_status_lists_the_clusters_other_slots(outbox, unique_name):
    other = unique_name("other")[:63]
    outbox.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (other,))
    try:
        done = cdc(outbox.env, "status", "--json")
    finally:
        outbox.conn.execute("SELECT pg_drop_replication_slot(%s)", (other,))
    report = json.loads(done.stdout)
    assert any(s.startswith(f"{other} (pgoutput, database ") for s in report["other_slots"]), report

"""Every metric and label that deploy/ (the Grafana dashboard, the Prometheus alert rules) uses is on the
/metrics of a running pipeline: a renamed metric cannot leave a dashboard blank or an alert silent."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_metrics import get
from tests.plugins.pipeline import free_port, order_placed, wait_until
from tests.unit.test_deploy import expressions, names

pytestmark = pytest.mark.integration

# Series that Prometheus makes itself: `up` per target, and the target labels it adds to every series.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"job", "instance"}


def test_every_metric_and_label_of_deploy_is_on_a_live_metrics_endpoint(outbox, pipeline_process):
    port = free_port()
    proc = pipeline_process(
        CDC_METRICS_PORT=str(port), CDC_MAX_DEAD_LETTERS="100", CDC_HEARTBEAT_INTERVAL="0.5"
    )
    proc.wait_streaming()
    txn = outbox.commit([outbox.event("m-1"), outbox.event("m-2", order_placed("m-2", amount_cents="x"))])
    wait_until(lambda: outbox.confirmed_lsn() >= txn.lsn_after, 30, "the events confirmed")

    def scrape() -> str:
        status, text = get(port, "/metrics")
        return (
            text if status == 200 and 'reason="payload_invalid"' in text and "cdc_slot_active" in text else ""
        )

    text = wait_until(scrape, 30, "a scrape with the dead letter and the slot")
    labels_of: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels_of.setdefault(sample.name, set()).update(sample.labels)
    problems = []
    for where, expr in expressions():
        metrics, labels = names(expr)
        known = TARGET_LABELS.union(*(labels_of.get(m, set()) for m in metrics))
        problems += [
            f"{where}: no metric {m}" for m in sorted(metrics - labels_of.keys() - PROMETHEUS_SERIES)
        ]
        problems += [f"{where}: no label {label} on {sorted(metrics)}" for label in sorted(labels - known)]
    assert not problems, "\n".join(problems)
    assert proc.terminate() == 0

"""`cdc audit --metrics-file`: the textfile it writes parses as Prometheus' text format, and every metric and
label the rules in deploy/prometheus/outbox-cdc-audit.yml use is in it."""

from __future__ import annotations

import io
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdc.ops.audit import AggregateCounts, AuditReport, Window
from cdc.ops.audit_report import (
    MISSING,
    REFUSED,
    WRITE_BATCH,
    metrics_text,
    summary,
    write_json,
    write_metrics_file,
)
from tests.unit.test_deploy import names, promtool

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "outbox-cdc-audit.yml"
MOMENT = datetime(2026, 12, 5, 12, tzinfo=UTC)


def report() -> AuditReport:
    window = Window(since=MOMENT, until=MOMENT, by_commit=True, acknowledged=MOMENT)
    counts = AggregateCounts(expected=5, published=3, dead_lettered=1, missing=1, duplicates=2)
    return AuditReport(window=window, aggregates={'or"der': counts})


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_a_judged_window_writes_its_counts():
    found = samples(metrics_text("cdc_outbox", MISSING, 1.5, report()))
    assert found["cdc_audit_result"] == [({"slot": "cdc_outbox"}, 1.0)]
    assert found["cdc_audit_missing_events"] == [({"slot": "cdc_outbox"}, 1.0)]
    assert found["cdc_audit_duplicates"] == [({"slot": "cdc_outbox"}, 2.0)]
    events = {
        (labels["aggregate_type"], labels["state"]): value for labels, value in found["cdc_audit_events"]
    }
    assert events[('or"der', "published")] == 3 and events[('or"der', "missing")] == 1
    assert found["cdc_audit_window_end_timestamp_seconds"][0][1] == MOMENT.timestamp()


def test_a_refusal_writes_the_verdict_alone(tmp_path):
    path = tmp_path / "audit.prom"
    write_metrics_file(path, metrics_text("s", REFUSED, 2.0))
    found = samples(path.read_text())
    assert set(found) == {"cdc_audit_result", "cdc_audit_last_run_timestamp_seconds"}
    assert list(tmp_path.iterdir()) == [path], "no temporary file is left behind"


def test_the_rules_use_only_what_the_file_holds():
    text = metrics_text("cdc_outbox", MISSING, 1.5, report())
    written = samples(text)
    labels = {label for rows in written.values() for row_labels, _ in rows for label in row_labels}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            metrics, used = names(str(rule["expr"]))
            assert metrics <= set(written), (rule["alert"], metrics - set(written))
            assert used <= labels, (rule["alert"], used - labels)
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_promtool_accepts_the_audit_rules():
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("result", [0, 1, 2, 3])
def test_each_verdict_is_one_line_of_the_format(result):
    assert samples(metrics_text("s", result, 0.0))["cdc_audit_result"] == [({"slot": "s"}, float(result))]


@pytest.mark.parametrize("count", [0, 1, 2, WRITE_BATCH, WRITE_BATCH + 1, 2 * WRITE_BATCH + 7])
def test_the_json_report_streams_the_ids_after_the_counts(count: int) -> None:
    ids = (f'id-{i}"\\' for i in range(count))  # a generator: read once, as from the server's cursor
    out = io.StringIO()
    write_json(report(), ids, out)
    text = out.getvalue()
    body = json.loads(text)
    assert body["missing_ids"] == [f'id-{i}"\\' for i in range(count)]
    assert {k: v for k, v in body.items() if k != "missing_ids"} == summary(report())
    assert list(body)[-1] == "missing_ids" and text.index('"missing"') < text.index('"missing_ids"')

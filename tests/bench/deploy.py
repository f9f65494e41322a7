"""`make bench-deploy`: what the image and the chart's pod cost in time, measured on the local stack with
podman (the chart rendered by helm, its pods run as tests/plugins/pods.py runs them), under a paced load of
200 events/s so that every gap has events waiting:

- the image's size;
- start: `podman run` to /healthz 200 (the process listens), to "streaming from slot", to /readyz 200;
- the pod's resident memory once streaming (VmRSS of its process);
- SIGTERM to exit (the grace the pod needs);
- a standby's takeover: the active pod's SIGTERM, or its kill -9, to the standby's "streaming from slot";
- Recreate's gap: the old pod's SIGTERM to the new pod's "streaming from slot" and /readyz 200, the new pod
  started when the old one exited (what a Deployment with strategy Recreate does; a cluster adds the pod's
  scheduling and sandbox, and its readiness probe's period, to the second figure).

Then every event written is counted on the topic by id (nothing lost). Figures: min / median / max over
--repeat rounds, and bench-results/deploy-<time>.json.

    make image && . .stack/env && python -m tests.bench.deploy --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient

from tests.bench.db import connect, drop_database, dsn_for, recreate_database
from tests.plugins.helm import install_helm, render_values
from tests.plugins.kafka import delete_topics, read_topics
from tests.plugins.pipeline import free_port, topic_size
from tests.plugins.podman import IMAGE_ID_FILE, Container, http_get, podman
from tests.plugins.pods import PodRun, pod_from, split_password

ROOT = Path(__file__).resolve().parents[2]
IMAGE_REF = "localhost/outbox-cdc:bench"
RATE_TXN = 20  # transactions a second, of 10 events each


class Pods:
    def __init__(self, objects: list[dict[str, Any]], secrets: dict[str, dict[str, str]], image: str) -> None:
        self.objects, self.secrets, self.image = objects, secrets, image
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
        self.started: list[Container] = []
        (self.deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        (self.job,) = [o for o in objects if o["kind"] == "Job"]

    def run(self, workload: dict[str, Any]) -> tuple[PodRun, Container]:
        run = pod_from(self.objects, workload, self.secrets, self.workdir, {IMAGE_REF: self.image})
        port = free_port()
        old = int(run.env["CDC_METRICS_PORT"])
        run.env["CDC_METRICS_PORT"] = str(port)
        run.probes = {k: (path, port if p == old else p) for k, (path, p) in run.probes.items()}
        name = f"cdc-bench-{uuid.uuid4().hex[:10]}"
        argv, env = run.argv(name, run.image)
        container = Container(argv, name, self.workdir / f"{name}.log", "pod", env)
        self.started.append(container)
        return run, container

    def cleanup(self) -> None:
        for container in self.started:
            container.cleanup()


def until(condition: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll every 20 ms; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic()


def logged(container: Container, text: str, count: int = 1) -> Callable[[], bool]:
    return lambda: container.log().count(text) >= count


def answers(run: PodRun, kind: str, status: int) -> Callable[[], bool]:
    path, port = run.probes[kind]
    return lambda: (http_get(port, path, timeout=1) or (0, ""))[0] == status


def rss_mb(container: Container) -> float:
    pid = podman("inspect", "--format", "{{.State.Pid}}", container.name).stdout.strip()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one_round(pods: Pods) -> dict[str, float]:
    figures: dict[str, float] = {}
    run_a, a = pods.run(pods.deployment)
    started = a.started_at
    figures["start_to_healthz_s"] = until(answers(run_a, "liveness", 200), 60, "/healthz") - started
    figures["start_to_streaming_s"] = until(logged(a, "streaming from slot"), 60, "streaming") - started
    figures["start_to_ready_s"] = until(answers(run_a, "readiness", 200), 60, "/readyz") - started
    time.sleep(2)
    figures["rss_streaming_mb"] = rss_mb(a)

    # A standby takes over after the active pod's SIGTERM.
    run_b, b = pods.run(pods.deployment)
    until(logged(b, "waiting to take over"), 60, "the standby to wait")
    a.signal("TERM")
    assert a.signalled_at is not None
    figures["takeover_after_sigterm_s"] = (
        until(logged(b, "streaming from slot"), 60, "takeover") - a.signalled_at
    )
    assert a.wait(60) == 0, a.tail()

    # And after its kill -9.
    run_c, c = pods.run(pods.deployment)
    until(logged(c, "waiting to take over"), 60, "the standby to wait")
    b.signal("KILL")
    assert b.signalled_at is not None
    figures["takeover_after_kill_s"] = (
        until(logged(c, "streaming from slot"), 60, "takeover") - b.signalled_at
    )
    b.wait(60)

    # Recreate: the old pod stops, then the new one starts.
    c.signal("TERM")
    assert c.signalled_at is not None
    assert c.wait(60) == 0, c.tail()
    exited = time.monotonic()
    figures["sigterm_to_exit_s"] = exited - c.signalled_at
    run_d, d = pods.run(pods.deployment)
    figures["recreate_gap_streaming_s"] = (
        until(logged(d, "streaming from slot"), 60, "new pod") - c.signalled_at
    )
    figures["recreate_gap_ready_s"] = (
        until(answers(run_d, "readiness", 200), 60, "new pod ready") - c.signalled_at
    )
    d.signal("TERM")
    assert d.wait(60) == 0, d.tail()
    return figures


def writer(dsn: str, table: str, stop: threading.Event) -> None:
    sql = psycopg.sql.SQL(
        "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
        " SELECT gen_random_uuid(), 'order', 'agg-' || (i % 7), 'OrderPlaced', 1,"
        " jsonb_build_object('order_id', 'o-' || i, 'customer_id', 'c-1', 'amount_cents', i,"
        " 'currency', 'EUR', 'items', jsonb_build_array())"
        " FROM generate_series(1, 10) AS i"
    ).format(psycopg.sql.Identifier(table))
    with connect(dsn) as conn:
        while not stop.is_set():
            conn.execute(sql)
            time.sleep(1 / RATE_TXN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy/image/containers.conf"))
    admin_dsn, bootstrap = os.environ["CDC_DATABASE_URL"], os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    image = os.environ.get("CDC_STACK_IMAGE") or IMAGE_ID_FILE.read_text().strip()
    size_mb = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6
    helm = install_helm()
    name = "bench_deploy"
    prefix = f"bench_deploy_{uuid.uuid4().hex[:6]}"
    with connect(admin_dsn) as admin:
        recreate_database(admin, name)
    dsn = dsn_for(admin_dsn, name)
    url, password = split_password(dsn)
    secrets = {"db": {"url": url, "password": password}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-deploy-values-"))
    values = {
        "image": {"repository": IMAGE_REF.split(":")[0], "tag": IMAGE_REF.split(":")[1]},
        "kafka": {"bootstrapServers": bootstrap},
        "settings": {"status_interval": 1, "log_format": "text"},
        "setup": {
            "enabled": True,
            "adminUrlSecret": {"name": "db", "key": "url"},
            "adminPasswordSecret": {"name": "db", "key": "password"},
        },
        "pipelines": [
            {
                "name": "orders",
                "standby": True,
                "database": {
                    "urlSecret": {"name": "db", "key": "url"},
                    "passwordSecret": {"name": "db", "key": "password"},
                },
                "topics": {"template": prefix + ".{aggregate_type}", "dlq": prefix + ".dlq"},
            }
        ],
    }
    pods = Pods(render_values(helm, values, workdir), secrets, image)
    admin_client = AdminClient({"bootstrap.servers": bootstrap})
    stop = threading.Event()
    rounds: list[dict[str, float]] = []
    try:
        _, job = pods.run(pods.job)
        assert job.wait(120) == 0, job.tail()
        thread = threading.Thread(target=writer, args=(dsn, "outbox", stop), daemon=True)
        thread.start()
        for i in range(args.repeat):
            rounds.append(one_round(pods))
            print(f"bench-deploy: round {i + 1}: " + " ".join(f"{k}={v:.2f}" for k, v in rounds[-1].items()))
        stop.set()
        thread.join(10)
        # Nothing lost: every event written is on the topic, read by id.
        _, last = pods.run(pods.deployment)
        until(logged(last, "streaming from slot"), 60, "the last pod")
        with connect(dsn) as conn:
            expected = {r[0] for r in conn.execute("SELECT id::text FROM outbox").fetchall()}
        topic = prefix + ".order"
        deadline = time.monotonic() + 60
        while True:
            records = read_topics(bootstrap, [topic], topic_size(bootstrap, topic), timeout=60)
            seen = {r.headers["id"].decode() for r in records}
            if expected <= seen or time.monotonic() > deadline:
                break
            time.sleep(1)
        missing = len(expected - seen)
        last.signal("TERM")
        last.wait(60)
    finally:
        stop.set()
        pods.cleanup()
        with connect(admin_dsn) as admin:
            drop_database(admin, name)
        delete_topics(admin_client, [prefix + ".order", prefix + ".dlq"])
    summary = {
        key: {
            "min": round(min(r[key] for r in rounds), 2),
            "median": round(statistics.median(r[key] for r in rounds), 2),
            "max": round(max(r[key] for r in rounds), 2),
        }
        for key in rounds[0]
    }
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "image_mb": round(size_mb, 1),
        "rounds": args.repeat,
        "events_written": len(expected),
        "events_missing": missing,
        "records_on_topic": len(records),
        "summary": summary,
    }
    out = ROOT / "bench-results" / f"deploy-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({**result, "all": rounds}, indent=2))
    print(
        f"bench-deploy: image {size_mb:.0f} MB; {len(expected)} events written, {missing} missing, "
        f"{len(records)} records on the topic"
    )
    for key, s in summary.items():
        print(f"bench-deploy: {key:28s} min {s['min']:6.2f}  median {s['median']:6.2f}  max {s['max']:6.2f}")
    print(f"bench-deploy: written to {out}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())

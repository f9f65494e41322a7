"""The chart's pods run: each test renders the chart, takes the rendered Deployment's (and the setup Job's)
container as a kubelet would (tests/plugins/pods.py: image, args, env from the ConfigMap, Secret references
resolved to the test's secrets, password files mounted, the securityContext as podman flags) and runs it with
podman against the local stack.

- The setup hook's `cdc setup` makes the outbox as the admin; the pod streams events, answers the rendered
  liveness and readiness paths on the rendered port, and exits 0 on SIGTERM within the rendered grace period.
- With `standby: true` the second replica waits for the slot, is alive but not ready, and takes over within
  the documented bound when the first is killed (kill -9), with every event published (counted by id).
- Why Recreate: a second pod beside the first, as a rolling update would start it, is refused (exit 2) and
  never ready while the first streams.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.config import Settings
from tests.plugins.helm import Render
from tests.plugins.kafka import read_topics
from tests.plugins.pipeline import free_port, topic_size, wait_until
from tests.plugins.podman import Container, ContainerOutbox, http_get
from tests.plugins.pods import PodRun, Secrets, StartPod, pod_from, split_password

pytestmark = [pytest.mark.integration, pytest.mark.image, pytest.mark.helm]

IMAGE_REF = "localhost/outbox-cdc:under-test"
# The documented bound of a takeover (docs/operations.md, "Standby"): source_silence_timeout, what a standby
# waits at most for a holder whose connection went silent (a dead node). After a kill -9 the kernel closes the
# connection and the standby, trying every second, takes the slot in about one (make bench-deploy).
TAKEOVER_BOUND = 10.0  # the test's source_silence_timeout


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


class Release:
    """A rendered release for one pipeline of the test's outbox, and the secrets it references."""

    def __init__(
        self,
        render: Render,
        outbox: ContainerOutbox,
        image: str,
        workdir: Path,
        *,
        standby: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> None:
        env = outbox.env
        url, password = split_password(env["CDC_DATABASE_URL"])
        self.port = free_port()
        self.secrets: Secrets = {
            "orders-db": {"url": url, "password": password},
            "orders-db-admin": {"url": url, "password": password},
        }
        values = {
            "image": {"repository": IMAGE_REF.split(":")[0], "tag": IMAGE_REF.split(":")[1]},
            "kafka": {"bootstrapServers": outbox.kafka_bootstrap},
            "settings": {"status_interval": 1, "log_format": "text", **(settings or {})},
            "metrics": {"port": self.port},
            "setup": {
                "enabled": True,
                "adminUrlSecret": {"name": "orders-db-admin", "key": "url"},
                "adminPasswordSecret": {"name": "orders-db-admin", "key": "password"},
            },
            "pipelines": [
                {
                    "name": "orders",
                    "standby": standby,
                    "database": {
                        "urlSecret": {"name": "orders-db", "key": "url"},
                        "passwordSecret": {"name": "orders-db", "key": "password"},
                    },
                    "slot": env["CDC_SLOT"],
                    "publication": env["CDC_PUBLICATION"],
                    "table": env["CDC_TABLE"],
                    "topics": {"template": env["CDC_TOPIC_TEMPLATE"], "dlq": env["CDC_DLQ_TOPIC"]},
                }
            ],
        }
        self.objects = render(values=values)
        (self.deployment,) = of_kind(self.objects, "Deployment")
        (self.job,) = of_kind(self.objects, "Job")
        self.image = image
        self.workdir = workdir

    def pod(self) -> PodRun:
        return pod_from(self.objects, self.deployment, self.secrets, self.workdir, {IMAGE_REF: self.image})

    def setup_job(self) -> PodRun:
        return pod_from(self.objects, self.job, self.secrets, self.workdir, {IMAGE_REF: self.image})


@pytest.fixture
def release(
    render: Render, container_outbox: ContainerOutbox, cdc_image: str, tmp_path: Path
) -> Callable[..., Release]:
    def make(**kwargs: Any) -> Release:
        return Release(render, container_outbox, cdc_image, tmp_path, **kwargs)

    return make


def probe(pod: Container, run: PodRun, kind: str) -> tuple[int, str] | None:
    path, port = run.probes[kind]
    return http_get(port, path)


def metric_text(run: PodRun) -> str:
    answer = http_get(run.ports["metrics"], "/metrics")
    assert answer is not None and answer[0] == 200
    return answer[1]


def run_setup(pods: StartPod, release: Release) -> None:
    job = pods(release.setup_job(), "setup-job")
    assert job.wait(120) == 0, job.tail()


def published_ids(outbox: ContainerOutbox) -> set[str]:
    """The ids of every record on the outbox's topic (a takeover publishes some twice: all are read)."""
    topic = outbox.attach().topic("order")
    records = read_topics(
        outbox.kafka_bootstrap, [topic], topic_size(outbox.kafka_bootstrap, topic), timeout=60
    )
    return {r.headers["id"].decode() for r in records}


def wait_published(outbox: ContainerOutbox, expected: set[str], timeout: float = 60) -> None:
    """Wait until every id of `expected` is on the topic; fail naming how many are not."""
    seen: set[str] = set()

    def done() -> bool:
        seen.update(published_ids(outbox))
        return expected <= seen

    try:
        wait_until(done, timeout, "every event on the topic", interval=1)
    except AssertionError:
        raise AssertionError(f"{len(expected - seen)} of {len(expected)} events were not published") from None


@pytest.fixture
def writer(container_outbox: ContainerOutbox) -> Iterator[Callable[[float], threading.Thread]]:
    """`writer(seconds)`: a thread that commits a transaction of 20 events every 50 ms on its own connection
    for that long."""
    threads: list[threading.Thread] = []
    stop = threading.Event()

    def start(seconds: float) -> threading.Thread:
        box = container_outbox.attach()
        sql = psycopg.sql.SQL(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload)"
            " SELECT gen_random_uuid(), 'order', 'agg-' || (i % 7), 'OrderPlaced', 1,"
            " jsonb_build_object('order_id', 'o-' || i, 'customer_id', 'c-1', 'amount_cents', i,"
            " 'currency', 'EUR', 'items', jsonb_build_array())"
            " FROM generate_series(1, 20) AS i"
        ).format(psycopg.sql.Identifier(box.table))

        def write() -> None:
            deadline = time.monotonic() + seconds
            with psycopg.connect(box.dsn, autocommit=True) as conn:
                while time.monotonic() < deadline and not stop.is_set():
                    conn.execute(sql)
                    time.sleep(0.05)

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    try:
        yield start
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def test_the_rendered_pod_sets_up_streams_answers_its_probes_and_stops_within_its_grace(
    pods: StartPod, release: Callable[..., Release], container_outbox: ContainerOutbox
) -> None:
    rel = release()
    run_setup(pods, rel)
    run = rel.pod()
    assert run.args == ["run"] and set(run.probes) == {"liveness", "readiness", "startup"}
    assert "--read-only" in run.flags and "--cap-drop=all" in run.flags
    assert run.env["CDC_DATABASE_PASSWORD_FILE"].startswith("/var/run/secrets/")
    assert "password" not in conninfo_to_dict(run.env["CDC_DATABASE_URL"])
    pod = pods(run, "pod")
    wait_until(lambda: probe(pod, run, "startup") == (200, "alive\n"), 60, "the startup probe")
    pod.wait_for_log(r"streaming from slot", 60)
    box = container_outbox.attach()
    box.bulk(300, per_transaction=50)
    wait_published(container_outbox, box.ids())
    assert len(box.ids()) == 300
    assert wait_until(lambda: probe(pod, run, "readiness"), 30, "readiness") == (200, "ready\n")
    assert probe(pod, run, "liveness") == (200, "alive\n")

    pod.signal("TERM")
    assert pod.signalled_at is not None
    rc = pod.wait(run.grace + 10)
    took = time.monotonic() - pod.signalled_at
    assert rc == 0, pod.tail()
    assert took < run.grace, f"exit {took:.1f} s after SIGTERM, beyond the grace period of {run.grace} s"


def test_a_standby_waits_unready_and_takes_over_when_the_active_pod_is_killed(
    pods: StartPod,
    release: Callable[..., Release],
    container_outbox: ContainerOutbox,
    writer: Callable[[float], threading.Thread],
) -> None:
    rel = release(standby=True, settings={"source_silence_timeout": TAKEOVER_BOUND})
    assert rel.deployment["spec"]["replicas"] == 2
    run_setup(pods, rel)
    first_run, second_run = rel.pod(), rel.pod()
    first = pods(first_run, "replica-1")
    first.wait_for_log(r"streaming from slot", 60)
    second = pods(second_run, "replica-2", port=free_port())
    second.wait_for_log(r"waiting to take over", 60)
    # Alive (the kubelet leaves it be), not ready (Services and alerts count one reader), for longer than
    # the startup probe's patience and a few liveness periods would matter here.
    time.sleep(3)
    assert probe(second, second_run, "liveness") == (200, "alive\n")
    readiness = probe(second, second_run, "readiness")
    assert readiness is not None and readiness[0] == 503 and "not streaming" in readiness[1]
    # And says so, for the alert rules (CdcNotReady leaves a standby out).
    assert "\ncdc_standby 1.0" in metric_text(second_run)
    assert "\ncdc_standby 0.0" in metric_text(first_run)
    assert wait_until(lambda: probe(first, first_run, "readiness"), 30, "replica 1 ready") == (200, "ready\n")

    thread = writer(8.0)
    time.sleep(2)
    first.signal("KILL")
    killed_at = time.monotonic()
    second.wait_for_log(r"streaming from slot", TAKEOVER_BOUND + 20)
    took = time.monotonic() - killed_at
    assert took < TAKEOVER_BOUND, (
        f"the standby took over {took:.1f} s after the kill -9 (bound: source_silence_timeout)"
    )
    wait_until(lambda: probe(second, second_run, "readiness") == (200, "ready\n"), 30, "replica 2 ready")
    assert "\ncdc_standby 0.0" in metric_text(second_run)
    thread.join(30)

    box = container_outbox.attach()
    expected = box.ids()
    assert len(expected) >= 200
    wait_published(container_outbox, expected)
    second.signal("TERM")
    assert second.wait(second_run.grace) == 0, second.tail()


def test_a_second_pod_beside_the_first_is_refused_which_is_why_the_strategy_is_recreate(
    pods: StartPod, release: Callable[..., Release]
) -> None:
    """What a RollingUpdate would do: start the new pod while the old one streams. It is refused (exit 2)
    without ever being ready, so the rollout could never finish; Recreate stops the old pod first."""
    rel = release()
    assert rel.deployment["spec"]["strategy"]["type"] == "Recreate"
    run_setup(pods, rel)
    old_run, new_run = rel.pod(), rel.pod()
    old = pods(old_run, "old")
    old.wait_for_log(r"streaming from slot", 60)
    new = pods(new_run, "new", port=free_port())
    # A refusal is quick when the holder speaks; bounded by source_silence_timeout otherwise.
    rc = new.wait(Settings(database_url="x").source_silence_timeout + 30)
    assert rc == 2, new.tail()
    assert "in use by another process" in new.log() or "is active" in new.log(), new.tail()
    assert probe(old, old_run, "readiness") == (200, "ready\n")

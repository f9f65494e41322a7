"""When the network goes quiet (issue 25): `cdc run` reaches PostgreSQL through a proxy that can freeze its
connections, keeping them open and forwarding nothing, as a NAT that forgot them or a hung load balancer
would. The pipeline must notice within source_silence_timeout, say so on /readyz, reconnect with nothing
lost, and stop on SIGTERM within shutdown_timeout however frozen its connections are."""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.stream.test_exactly_once import ids, read_all
from tests.integration.test_metrics import get, metric
from tests.plugins.pipeline import Outbox, free_port, wait_until
from tests.plugins.postgres import dsn_for
from tests.plugins.proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SILENCE = 6  # seconds: CDC_SOURCE_SILENCE_TIMEOUT in these tests
BROKER_REQUEST_BOUND = 60  # librdkafka's socket.timeout.ms, the default


class Load:
    """Commits one event every ``period`` seconds straight to PostgreSQL (not through the proxy)."""

    def __init__(self, outbox: Outbox, period: float = 0.05) -> None:
        self.outbox, self.period = outbox, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.count = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.outbox.commit([self.outbox.event(f"q-{self.count % 5}")])
            self.count += 1
            time.sleep(self.period)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def proxied(outbox: Outbox, tcp_proxy) -> tuple[TcpProxy, dict[str, str]]:
    params = outbox.conn.info.get_parameters()
    proxy = tcp_proxy(outbox.conn.info.host, int(params.get("port", outbox.conn.info.port)))
    env = {
        "CDC_DATABASE_URL": dsn_for(outbox.dsn, host="127.0.0.1", port=str(proxy.port)),
        "CDC_SOURCE_SILENCE_TIMEOUT": str(SILENCE),
        "CDC_QUERY_TIMEOUT": "3",
        "CDC_HEARTBEAT_INTERVAL": "2",
    }
    return proxy, env


def arrived(bootstrap: str, outbox: Outbox) -> set[str]:
    """Every event id in the topic (at-least-once: a reconnect publishes some again)."""
    return set(ids(read_all(bootstrap, outbox.topic("order"))))


def test_frozen_connections_are_noticed_and_replaced_under_load_with_nothing_lost(
    outbox: Outbox, pipeline_process, proxied, kafka_bootstrap
):
    proxy, env = proxied
    port = free_port()
    proc = pipeline_process(**env, CDC_METRICS_PORT=str(port))
    proc.wait_streaming()
    with Load(outbox):
        wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "ready")
        time.sleep(2)
        proxy.freeze()  # every connection open through it goes silent; new ones pass
        frozen_at = time.monotonic()
        proc.wait_for_log(r"taken for dead", SILENCE + 10)
        noticed = time.monotonic() - frozen_at
        proc.wait_for_log(r"resuming after confirmed LSN .* \(reconnected\)", 30)
        before = outbox.current_lsn()
        wait_until(lambda: outbox.confirmed_lsn() >= before, 30, "the new connection to confirm new events")
        resumed = time.monotonic() - frozen_at
        time.sleep(1)
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed every event")
    expected = outbox.ids()
    missing = expected - arrived(kafka_bootstrap, outbox)
    assert not missing, f"{len(missing)} events missing"
    print(f"freeze noticed after {noticed:.1f} s, stream confirming again after {resumed:.1f} s")
    assert noticed <= SILENCE + 3
    assert resumed <= SILENCE + 15
    assert proc.terminate(timeout=40) == 0, proc.tail()


def test_a_new_start_takes_the_slot_from_the_frozen_walsender_of_a_killed_pipeline(
    outbox: Outbox, pipeline_process, proxied, kafka_bootstrap
):
    """A pipeline killed while its connections were frozen leaves a walsender that the server keeps until
    wal_sender_timeout (60 s here): the next start ends it once its client has been silent for
    source_silence_timeout, rather than exit with "slot in use" until then."""
    proxy, env = proxied
    proc = pipeline_process(**env)
    proc.wait_streaming()
    with Load(outbox):
        time.sleep(2)
        proxy.freeze()
        proc.kill()
        killed_at = time.monotonic()
        again = pipeline_process(**env)
        again.wait_for_log(r"whose client had sent nothing for \d+ s", SILENCE + 15)
        again.wait_for_log(r"resuming after confirmed LSN", 15)
        taken = time.monotonic() - killed_at
        before = outbox.current_lsn()
        wait_until(lambda: outbox.confirmed_lsn() >= before, 30, "the new start to confirm new events")
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 30, "the slot confirmed every event")
    missing = outbox.ids() - arrived(kafka_bootstrap, outbox)
    assert not missing, f"{len(missing)} events missing"
    print(f"slot taken over {taken:.1f} s after the kill")
    assert taken <= SILENCE + 10
    assert again.terminate(timeout=40) == 0, again.tail()


def test_readyz_says_when_postgresql_is_silent_and_sigterm_ends_a_frozen_process(
    outbox: Outbox, pipeline_process, proxied
):
    proxy, env = proxied
    port = free_port()
    proc = pipeline_process(**env, CDC_METRICS_PORT=str(port), CDC_SHUTDOWN_TIMEOUT="10")
    proc.wait_streaming()
    wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "ready")
    proxy.freeze(new_too=True)  # everything through the proxy, old and new connections, goes silent
    status, body = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, SILENCE + 15, "not ready")
    assert "PostgreSQL" in body, body
    metrics = get(port, "/metrics")[1]
    assert "cdc_ready 0.0" in metrics
    assert get(port, "/healthz")[0] == 200, "a wait with a bound is no reason to restart the process"
    stopping = time.monotonic()
    rc = proc.terminate(timeout=30)
    took = time.monotonic() - stopping
    assert rc in (0, 1), proc.tail()
    assert took <= 10 + 2, f"SIGTERM took {took:.1f} s with shutdown_timeout = 10"


def test_the_seconds_since_the_last_server_message_are_a_metric(outbox: Outbox, pipeline_process, proxied):
    proxy, env = proxied
    port = free_port()
    proc = pipeline_process(**env, CDC_METRICS_PORT=str(port))
    proc.wait_streaming()
    wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "ready")
    assert metric(get(port, "/metrics")[1], "cdc_seconds_since_last_server_message") < SILENCE
    proxy.freeze()
    wait_until(
        lambda: metric(get(port, "/metrics")[1], "cdc_seconds_since_last_server_message") >= SILENCE / 2,
        SILENCE + 5,
        "the silence to show",
    )
    proxy.thaw()
    assert proc.terminate(timeout=40) == 0, proc.tail()


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_a_silent_broker_bounds_every_wait_and_the_stream_resumes_when_it_answers(
    outbox: Outbox, pipeline_process, proxied_kafka, unique_name, delivery
):
    """Kafka goes quiet (every connection through its proxy frozen, new ones too) under load: /readyz says
    so, librdkafka's timeouts end the pipeline's waits (produce, flush, commit), SIGTERM ends the process
    within shutdown_timeout, and after the thaw a new run publishes everything."""
    broker, proxy = proxied_kafka
    port = free_port()
    checkpoints = unique_name("ckpt")
    env = {
        "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "CDC_DELIVERY": delivery,
        "CDC_CHECKPOINT_TOPIC": checkpoints,
        "CDC_DELIVERY_TIMEOUT": "5",
        "CDC_SHUTDOWN_TIMEOUT": "10",
        "CDC_METRICS_PORT": str(port),
        "CDC_STARTUP_TIMEOUT": "90",  # a broker just started: its transaction coordinator may still load
    }
    proc = pipeline_process(**env)
    proc.wait_streaming()
    if delivery == "exactly-once":
        proc.wait_for_log(r"exactly-once: transactional id", 90)
    with Load(outbox):
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "ready")
        time.sleep(1)
        proxy.freeze(new_too=True)
        status, body = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, 30, "not ready")
        assert "Kafka" in body, body
        stopping = time.monotonic()
        rc = proc.terminate(timeout=30)
        took = time.monotonic() - stopping
    assert rc in (0, 1), proc.tail()
    assert took <= 10 + 2, f"SIGTERM took {took:.1f} s with shutdown_timeout = 10"
    proxy.thaw()
    again = pipeline_process(**{**env, "CDC_METRICS_PORT": str(free_port())})
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 90, "the slot confirmed every event")
    seen = set(ids(read_all(broker.bootstrap, outbox.topic("order"))))
    missing = outbox.ids() - seen
    assert not missing, f"{len(missing)} events missing"
    assert again.terminate(timeout=40) == 0, again.tail()


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_frozen_broker_connections_end_within_the_request_timeout_and_nothing_is_lost(
    outbox: Outbox, pipeline_process, proxied_kafka, unique_name, delivery
):
    """The connections open to the broker go silent for good (new ones pass), with librdkafka's default
    timeouts. Its request in flight times out after socket.timeout.ms (BROKER_REQUEST_BOUND), and the events
    it carried fail. At least once: `cdc run` exits 1 without confirming past them, as for any delivery
    that failed, and the restart a supervisor makes (new connections) publishes them. Exactly once: the
    transaction aborts and the pipeline restarts from the checkpoint on a new producer, in the process."""
    broker, proxy = proxied_kafka
    env = {
        "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "CDC_DELIVERY": delivery,
        "CDC_CHECKPOINT_TOPIC": unique_name("ckpt"),
        "CDC_STARTUP_TIMEOUT": "90",
    }
    proc = pipeline_process(**env)
    proc.wait_streaming()
    if delivery == "exactly-once":
        proc.wait_for_log(r"exactly-once: transactional id", 90)
    with Load(outbox):
        time.sleep(3)
        before = outbox.current_lsn()
        wait_until(lambda: outbox.confirmed_lsn() >= before, 60, "the stream to confirm before the freeze")
        proxy.freeze()
        frozen_at = time.monotonic()
        time.sleep(1)
        at_freeze = outbox.current_lsn()
        if delivery == "at-least-once":
            assert proc.wait(timeout=BROKER_REQUEST_BOUND + 15) == 1, proc.tail()
            print(f"exit 1 {time.monotonic() - frozen_at:.1f} s after the freeze")
            assert "Message timed out; stopping without confirming past it" in proc.tail()
            assert outbox.confirmed_lsn() < at_freeze
            proc = pipeline_process(**env)  # what systemd's Restart= or Kubernetes does
            proc.wait_streaming()
        # Exactly once, the abort of the failed transaction may wait on the frozen coordinator connection
        # too: up to a second request timeout before a new producer replaces the old one.
        bound = BROKER_REQUEST_BOUND + 20 if delivery == "at-least-once" else 2 * BROKER_REQUEST_BOUND + 20
        wait_until(lambda: outbox.confirmed_lsn() >= at_freeze, bound + 10, "the stream past the freeze")
        resumed = time.monotonic() - frozen_at
    last = outbox.transactions[-1]
    wait_until(lambda: outbox.confirmed_lsn() >= last.lsn_after, 90, "the slot confirmed every event")
    missing = outbox.ids() - set(ids(read_all(broker.bootstrap, outbox.topic("order"))))
    assert not missing, f"{len(missing)} events missing"
    print(f"{delivery}: stream confirming past the freeze {resumed:.1f} s after it")
    assert resumed <= bound
    assert proc.terminate(timeout=40) == 0, proc.tail()

"""The metrics endpoint: loopback unless told otherwise, and /readyz that does not hammer Kafka."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

from cdc.metrics import MAX_CONNECTIONS, READY_CACHE_SECONDS, MetricsServer


class _Pipeline:
    def __init__(self) -> None:
        self.asked = 0
        self.reasons: list[str] = []

    def not_ready(self) -> list[str]:
        self.asked += 1
        return list(self.reasons)

    def alive(self) -> str | None:
        return None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_endpoint_listens_on_loopback_by_default():
    server = MetricsServer(_Pipeline(), 0)  # type: ignore[arg-type]
    server.start()  # stop() waits for the serving loop, which must be running
    try:
        assert server._server.server_address[0] == "127.0.0.1"
    finally:
        server.stop()


def test_readiness_is_asked_of_the_pipeline_at_most_once_per_cache_period():
    pipeline, clock = _Pipeline(), _Clock()
    server = MetricsServer(pipeline, 0, clock=clock)  # type: ignore[arg-type]
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/readyz"
        for _ in range(5):
            with urllib.request.urlopen(url, timeout=5) as answer:
                assert answer.status == 200
        assert pipeline.asked == 1
        pipeline.reasons = ["Kafka does not answer"]
        clock.now += READY_CACHE_SECONDS
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("a pipeline that is not ready answered 200")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"Kafka does not answer" in exc.read()
        assert pipeline.asked == 2
    finally:
        server.stop()


def test_a_client_that_sends_nothing_does_not_keep_healthz_from_answering():
    server = MetricsServer(_Pipeline(), 0)  # type: ignore[arg-type]
    server.start()
    idle = socket.create_connection(("127.0.0.1", server.port))
    half = socket.create_connection(("127.0.0.1", server.port))
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")  # and never the rest
    try:
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as answer:
            assert answer.status == 200
        assert time.monotonic() - started < 2
    finally:
        idle.close()
        half.close()
        server.stop()


def handlers() -> int:
    """The metrics server's connection threads (socketserver names them after their target)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_a_hundred_silent_clients_hold_no_more_than_the_cap_and_a_probe_is_refused_at_once():
    """Issue 42, item 7: a thread per connection, capped. Above MAX_CONNECTIONS a connection is answered 503
    at once (a probe fails fast, never hangs); the thread count stays bounded; once the silent clients go,
    /healthz answers again."""
    server = MetricsServer(_Pipeline(), 0)  # type: ignore[arg-type]
    server.start()
    clients = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(100)]
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        deadline = time.monotonic() + 5
        while handlers() + getattr(server, "refused", 0) < 100:
            assert time.monotonic() < deadline, (
                handlers(),
                getattr(server, "refused", 0),
            )
            time.sleep(0.01)
        assert handlers() <= MAX_CONNECTIONS
        assert server.refused == 100 - MAX_CONNECTIONS
        clients[-1].settimeout(5)
        assert clients[-1].recv(200).startswith(b"HTTP/1.1 503 Service Unavailable")

        started = time.monotonic()
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("a probe above the cap was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"too many connections" in exc.read()
        assert time.monotonic() - started < 1
        assert server.refused == 100 - MAX_CONNECTIONS + 1
    finally:
        for client in clients:
            client.close()
    try:
        deadline = time.monotonic() + 5
        while True:  # the handlers see their clients gone and end
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    assert answer.status == 200
                    break
            except urllib.error.HTTPError as exc:
                assert exc.code == 503 and time.monotonic() < deadline
                time.sleep(0.05)
        deadline = time.monotonic() + 5
        while handlers():  # the last ones are ending: every thread goes with its client
            assert time.monotonic() < deadline, handlers()
            time.sleep(0.01)
    finally:
        server.stop()

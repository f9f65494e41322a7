"""A run's Kafka clients end with it (cdc.stream.sink.KafkaSink.close, cdc.cli.process_end): librdkafka's
threads of a client still alive when the process exits crash it now and then, after its last line (SIGSEGV in
rdk:broker-1 with TLS: the secure stack's refused start exited -11 instead of 2 once in CI)."""

from __future__ import annotations

import threading

import pytest

from cdc.cli.process_end import librdkafka_thread_ids
from cdc.stream.life import Streaming
from cdc.stream.pipeline import Pipeline
from tests.plugins.pipeline import Outbox, PipelineProcess, wait_until

pytestmark = pytest.mark.core


def librdkafka_tids() -> set[int]:
    """This process's librdkafka threads by id: other tests' clients, which the collector may end at any
    time, come and go beside the run's own."""
    return set(librdkafka_thread_ids())


def test_a_stopped_run_has_destroyed_its_kafka_clients_when_it_returns(outbox: Outbox) -> None:
    before = librdkafka_tids()  # the fixtures' and earlier tests' clients
    pipeline = Pipeline(outbox.settings)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run()
        except BaseException as exc:  # the test's thread asserts on it
            failed.append(exc)

    thread = threading.Thread(target=run, name="pipeline", daemon=True)
    thread.start()
    try:
        wait_until(lambda: isinstance(pipeline.life.state, Streaming) or failed, 60, "streaming")
        assert not failed, failed
        own = librdkafka_tids() - before
        assert own, "no librdkafka thread of the run's clients"
        sent = outbox.commit([outbox.event(f"end-{i}") for i in range(3)])
        wait_until(lambda: outbox.confirmed_lsn() >= sent.lsn_after, 60, "the events confirmed")
    finally:
        pipeline.request_stop()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
    assert pipeline.sink.closed
    assert not own & librdkafka_tids(), "a Kafka client of the run outlived it"


def test_cdc_run_stopped_by_sigterm_exits_0_with_no_client_left_for_the_teardown(
    outbox: Outbox, tmp_path
) -> None:
    proc = PipelineProcess(outbox.env, tmp_path / "cdc.log")
    try:
        proc.wait_streaming()
        proc.proc.terminate()
        assert proc.wait(timeout=60) == 0, proc.tail()
        assert "still open at exit" not in proc.log(), proc.tail()
    finally:
        proc.cleanup()

"""Kafka's SASL password from a file, rotated while `cdc run` streams (issue 27 item 5): the broker's
connections are cut, the reconnection is refused with the old password, the file is read again, and the
stream goes on with the new one, in the same process, nothing lost."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.integration.secure.test_refusals import pipeline_grants
from tests.plugins.kafka import read_topic
from tests.plugins.pipeline import PipelineProcess, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.secure]


def cut_connections_to(bootstrap: str) -> None:
    """Abort every client connection to the broker's port (ss -K, root): what a broker restart or a
    network fault does to the pipeline's connections."""
    port = bootstrap.rsplit(":", 1)[1]
    done = subprocess.run(
        ["ss", "-K", "dst", "127.0.0.1", "dport", "=", port], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


def test_a_rotated_kafka_password_is_read_again_from_its_file(
    outbox, kafka_user, kafka_admin: AdminClient, kafka_bootstrap, tmp_path
):
    if os.geteuid() != 0:
        pytest.fail("cutting the broker's connections (ss -K) needs root, as CI runs")
    user = kafka_user(*pipeline_grants(outbox).values())
    password_file = tmp_path / "kafka-password"
    password_file.write_text(user.password + "\n")
    env = {
        **outbox.env,
        "CDC_KAFKA_SASL_USERNAME": user.name,
        "CDC_KAFKA_SASL_PASSWORD": "",  # not the stack's: the file gives it
        "CDC_KAFKA_SASL_PASSWORD_FILE": str(password_file),
    }
    proc = PipelineProcess(env, tmp_path / "cdc.log")
    try:
        proc.wait_streaming()
        first = outbox.commit([outbox.event(f"a-{i}") for i in range(3)])
        assert len(read_topic(kafka_bootstrap, outbox.topic("order"), 3, timeout=60)) == 3, proc.tail()
        wait_until(lambda: outbox.confirmed_lsn() >= first.lsn_after, 30, "the first events confirmed")

        rotated = secrets.token_urlsafe(18)
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        for future in kafka_admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user.name, info, rotated.encode())]
        ).values():
            future.result(timeout=30)
        password_file.write_text(rotated + "\n")
        cut_connections_to(kafka_bootstrap)

        second = outbox.commit([outbox.event(f"b-{i}") for i in range(3)])
        got = read_topic(kafka_bootstrap, outbox.topic("order"), 6, timeout=90)
        assert {r.headers["id"].decode() for r in got} >= set(second.ids), proc.tail()
        wait_until(lambda: outbox.confirmed_lsn() >= second.lsn_after, 60, "the later events confirmed")
        assert proc.proc.poll() is None, "the pipeline restarted or stopped:\n" + proc.tail()
        log = proc.log()
        assert "read kafka_sasl_password_file again, and it changed" in log, proc.tail()
        assert rotated not in log and user.password not in log
        assert proc.terminate(timeout=40) == 0, proc.tail()
    finally:
        proc.cleanup()

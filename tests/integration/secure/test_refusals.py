"""Every misconfiguration of a secure deployment is refused plainly (issue 27 item 4): `cdc run` exits 2 with
one error line that names the setting or the right to fix, and no secret shows in its output.

Against the secure stack (`make test-secure`): PostgreSQL with TLS and SCRAM, Kafka with SASL_SSL and ACLs,
the registry on HTTPS. Each case changes one thing in a working configuration. The Kafka rights are those
of a user of the test's own (tests/plugins/kafka_acl.py), granted all that `cdc run` needs but one."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AclBinding, AdminClient
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.integration.stream.test_pipeline import error_line, run_refused
from tests.plugins.kafka import kafka_security_env, read_topic
from tests.plugins.kafka_acl import Grant, KafkaUser, revoke
from tests.plugins.pipeline import Outbox, PipelineProcess, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.secure]

TOPIC_RIGHTS = ("Write", "Describe", "Create", "DescribeConfigs")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA that signed none of the stack's certificates."""
    home = tmp_path_factory.mktemp("other-ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=another CA",
         "-keyout", str(home / "ca.key"), "-out", str(home / "ca.pem")],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return str(home / "ca.pem")


def dsn(outbox: Outbox, **changes: str) -> str:
    params = conninfo_to_dict(outbox.dsn)
    params.update(changes)
    return make_conninfo(**params)


def secrets_of(env: dict[str, str], outbox: Outbox) -> list[str]:
    found = [conninfo_to_dict(outbox.dsn).get("password") or "", os.environ["CDC_KAFKA_SASL_PASSWORD"]]
    found.append(env.get("CDC_KAFKA_SASL_PASSWORD", ""))
    return [s for s in found if len(s) >= 8]


def refused(outbox: Outbox, changes: dict[str, str], *args: str) -> str:
    """`cdc run` with ``changes``: exit 2 within the start-up wait, one error line (returned), no secret."""
    env = {**outbox.env, "CDC_STARTUP_TIMEOUT": "5", **changes}
    code, stderr, elapsed = run_refused(env, timeout=90, args=list(args))
    assert code == 2, stderr[-3000:]
    for secret in secrets_of(env, outbox):
        assert secret not in stderr, "a secret in the output"
    assert elapsed < 60, stderr[-2000:]
    return error_line(stderr)


# -- who we are: TLS and passwords -----------------------------------------------------------------------


def test_postgresql_untrusted_ca(outbox, other_ca):
    line = refused(outbox, {"CDC_DATABASE_URL": dsn(outbox, sslrootcert=other_ca)})
    assert "certificate verify failed" in line and "sslrootcert" in line, line


def test_postgresql_host_the_certificate_does_not_name(outbox):
    # hostaddr reaches the server; host is what the certificate must name.
    wrong = dsn(outbox, host="db.example.invalid", hostaddr="127.0.0.1")
    line = refused(outbox, {"CDC_DATABASE_URL": wrong})
    assert "does not match host name" in line and "does not name the host in database_url" in line, line


def test_postgresql_wrong_password(outbox):
    line = refused(outbox, {"CDC_DATABASE_URL": dsn(outbox, password="not-the-password-0")})
    assert "refused the password" in line and "database_password_file" in line, line
    assert "not-the-password-0" not in line


def test_postgresql_plaintext_to_a_tls_only_server(outbox):
    line = refused(outbox, {"CDC_DATABASE_URL": dsn(outbox, sslmode="disable")})
    assert "only over TLS" in line and "sslmode=verify-full" in line, line


def test_kafka_untrusted_ca(outbox, other_ca):
    line = refused(outbox, {"CDC_KAFKA_SSL_CA_LOCATION": other_ca})
    assert "'kafka.ssl.ca.location'" in line and "not signed by a CA" in line, line


def test_kafka_host_the_certificate_does_not_name(outbox):
    # 127.1 is 127.0.0.1 to the resolver, but not a name the broker's certificate holds.
    stack = os.environ["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    changes = {**kafka_security_env(stack), "CDC_KAFKA_BOOTSTRAP_SERVERS": "127.1:" + stack.rsplit(":", 1)[1]}
    line = refused(outbox, changes)
    assert "'kafka.bootstrap_servers'" in line and "does not name the host" in line, line


def test_kafka_wrong_password(outbox):
    line = refused(outbox, {"CDC_KAFKA_SASL_PASSWORD": "not-the-password-1"})
    assert "refused the credentials of user 'cdc'" in line and "'kafka.sasl.password'" in line, line


def test_kafka_plaintext_to_a_tls_listener(outbox):
    plain = {"CDC_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}
    plain |= {
        k: "" for k in ("CDC_KAFKA_SASL_MECHANISM", "CDC_KAFKA_SASL_USERNAME", "CDC_KAFKA_SASL_PASSWORD")
    }
    plain["CDC_KAFKA_SSL_CA_LOCATION"] = ""
    line = refused(outbox, plain)
    assert "'kafka.security.protocol'" in line and "speaks TLS" in line, line


@pytest.mark.parametrize(
    ("mechanism", "says"),
    [
        ("GSSAPI", "names a mechanism this librdkafka does not have"),  # the client library lacks it
        ("PLAIN", "which the broker's listener does not take"),  # the broker does not offer it
    ],
)
def test_kafka_sasl_mechanism(outbox, mechanism, says):
    line = refused(outbox, {"CDC_KAFKA_SASL_MECHANISM": mechanism})
    assert "'kafka.sasl.mechanism'" in line and says in line, line


def test_registry_untrusted_ca(outbox, other_ca):
    changes = {
        "CDC_VALUE_FORMAT": "confluent",
        "CDC_SCHEMA_REGISTRY_URL": os.environ["CDC_SCHEMA_REGISTRY_URL"],
        "CDC_SCHEMA_REGISTRY_CA_FILE": other_ca,
    }
    line = refused(outbox, changes)
    assert "schema_registry_ca_file" in line and "not signed by a CA" in line, line


# -- what we may do: Kafka's ACLs ------------------------------------------------------------------------


def pipeline_grants(outbox: Outbox, checkpoints: str | None = None) -> dict[str, Grant]:
    """Everything `cdc run` needs on the outbox's names (docs/operations.md, "Secure deployment")."""
    grants = {
        "topics": Grant("topic", outbox.topic_prefix + ".", TOPIC_RIGHTS, prefixed=True),
        "dlq": Grant("topic", outbox.dlq_topic, TOPIC_RIGHTS),
        "idempotence": Grant("cluster", "", ("IdempotentWrite",)),
    }
    if checkpoints is not None:
        grants["checkpoints"] = Grant("topic", checkpoints, (*TOPIC_RIGHTS, "Read"))
        grants["transactional_id"] = Grant(
            "transactional_id", "outbox-cdc.", ("Write", "Describe"), prefixed=True
        )
        grants["checkpoint_group"] = Grant("group", "outbox-cdc-checkpoint-", ("Describe",), prefixed=True)
    return grants


def without(grants: dict[str, Grant], name: str, operation: str | None = None) -> list[Grant]:
    """The grants, less ``operation`` on ``name`` (all of ``name`` when None)."""
    out = dict(grants)
    if operation is None:
        del out[name]
    else:
        g = out[name]
        out[name] = Grant(g.resource, g.name, tuple(op for op in g.operations if op != operation), g.prefixed)
    return list(out.values())


def as_user(outbox: Outbox, user: KafkaUser, **extra: str) -> dict[str, str]:
    return {**user.env(), "CDC_DELIVERY_TIMEOUT": "20", **extra}


@pytest.mark.parametrize(
    ("grant", "operation", "right"),
    [
        ("topics", "Write", "Write on Topic:{topic}"),
        ("topics", "Create", "Create on Topic:{topic}"),
        ("topics", "DescribeConfigs", "DescribeConfigs on Topic:{topic}"),
        ("dlq", None, "Write on Topic:{dlq}"),
        ("dlq", "Write", "Write on Topic:{dlq}"),
    ],
)
def test_a_missing_topic_right_is_refused_with_the_grant(outbox, kafka_user, grant, operation, right):
    user = kafka_user(*without(pipeline_grants(outbox), grant, operation))
    outbox.commit([outbox.event("a-1"), outbox.event("a-2")])
    line = refused(outbox, as_user(outbox, user))
    want = right.format(topic=outbox.topic("order"), dlq=outbox.dlq_topic)
    assert f"the right {want}" in line and f"--allow-principal User:{user.name}" in line, line
    assert outbox.confirmed_lsn() <= outbox.transactions[0].lsn_before, "confirmed past a refusal"


@pytest.mark.parametrize(
    ("grant", "operation", "right"),
    [
        ("transactional_id", None, "Write on TransactionalId:outbox-cdc."),
        ("checkpoints", "Read", "Read on Topic:{checkpoints}"),
        ("checkpoint_group", None, "Describe on Group:outbox-cdc-checkpoint-"),
        ("topics", "Write", "Write on Topic:{topic}"),  # inside a Kafka transaction
    ],
)
def test_exactly_once_without_its_rights_is_refused(outbox, kafka_user, unique_name, grant, operation, right):
    checkpoints = unique_name("ckpt")
    outbox.topics.append(checkpoints)
    user = kafka_user(*without(pipeline_grants(outbox, checkpoints), grant, operation))
    outbox.commit([outbox.event("a-1")])
    line = refused(
        outbox, as_user(outbox, user, CDC_DELIVERY="exactly-once", CDC_CHECKPOINT_TOPIC=checkpoints)
    )
    assert f"the right {right.format(checkpoints=checkpoints, topic=outbox.topic('order'))}" in line, line
    assert outbox.confirmed_lsn() <= outbox.transactions[0].lsn_before, "confirmed past a refusal"


def test_the_pipeline_streams_with_exactly_the_documented_rights(
    outbox, kafka_user, kafka_bootstrap, tmp_path
):
    """The grants of docs/operations.md are enough, IdempotentWrite aside: since Kafka 3.0 Write on a topic
    implies it (KIP-679), so a deployment without it streams too."""
    user = kafka_user(*without(pipeline_grants(outbox), "idempotence"))
    events = [outbox.event(f"a-{i}") for i in range(5)]
    outbox.commit(events)
    proc = PipelineProcess({**outbox.env, **as_user(outbox, user)}, tmp_path / "cdc.log")
    try:
        got = read_topic(kafka_bootstrap, outbox.topic("order"), len(events), timeout=60)
        assert len(got) == len(events), proc.tail()
        assert proc.terminate(timeout=40) == 0, proc.tail()
    finally:
        proc.cleanup()


def test_a_right_revoked_while_streaming_stops_the_pipeline_with_the_grant(
    outbox, kafka_user, kafka_admin: AdminClient, kafka_bootstrap, tmp_path
):
    """The documented runtime behaviour: nothing confirmed past the first record Kafka refused, exit 2
    with the grant, and everything before it in Kafka."""
    grants = pipeline_grants(outbox)
    user = kafka_user(*grants.values())
    proc = PipelineProcess({**outbox.env, **as_user(outbox, user)}, tmp_path / "cdc.log")
    try:
        proc.wait_streaming()
        before = outbox.commit([outbox.event(f"b-{i}") for i in range(3)])
        assert len(read_topic(kafka_bootstrap, outbox.topic("order"), 3, timeout=60)) == 3, proc.tail()
        wait_until(lambda: outbox.confirmed_lsn() >= before.lsn_after, 30, "the first events confirmed")
        write: list[AclBinding] = [
            b for b in grants["topics"].bindings(f"User:{user.name}") if b.operation.name == "WRITE"
        ]
        revoke(kafka_admin, write)
        time.sleep(1)  # the authorizer applies the metadata change on every broker
        after = outbox.commit([outbox.event(f"c-{uuid.uuid4().hex[:6]}")])
        code = proc.wait(timeout=90)
        assert code == 2, proc.tail()
        assert f"the right Write on Topic:{outbox.topic('order')}" in proc.tail(), proc.tail()
        assert outbox.confirmed_lsn() < after.lsn_after, "confirmed past the refused event"
    finally:
        proc.cleanup()


def test_no_secret_in_the_log_of_a_refused_start(outbox, tmp_path: Path):
    """The refusals above check stderr; the log file of a supervised run is the same stream."""
    env = {**outbox.env, "CDC_STARTUP_TIMEOUT": "3", "CDC_KAFKA_SASL_PASSWORD": "a-wrong-secret-4242"}
    proc = PipelineProcess(env, tmp_path / "cdc.log")
    try:
        assert proc.wait(timeout=60) == 2, proc.tail()
        text = (tmp_path / "cdc.log").read_text()
        assert "still open at exit" not in text, text
        assert "a-wrong-secret-4242" not in text and os.environ["CDC_KAFKA_SASL_PASSWORD"] not in text
    finally:
        proc.cleanup()

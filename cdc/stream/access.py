"""Kafka's refusals of who the pipeline is and of what it may do: the setting or the right to fix, named;
and the SASL password of ``kafka_sasl_password_file``, read as each client is made.

librdkafka reports every failed connection to the caller as "Broker transport failure", whatever the cause.
The cause reaches its error callback: an untrusted certificate, credentials the broker refused, a SASL
mechanism its listener does not take, TLS against a plaintext listener. :class:`ConnectionErrors` keeps the
last of them, and :func:`connection_refusal` turns them into the setting to change. A certificate that
fails verification is looked at again with Python's own TLS client, which tells a host name the certificate
does not name from a CA that did not sign it; a plaintext client against a TLS listener leaves no error at
all (the broker just closes), and the same probe finds the TLS.

Authorization is Kafka's ACLs: a right the pipeline lacks fails one request, with the resource in the
reply. :func:`missing_rights` asks at the start what the pipeline may do with the topics it knows
(Metadata's authorized operations, KIP-430), and :func:`authorization_refusal` names the grant for a
request Kafka refused while running. Every refusal is an :class:`AccessDeniedError` (exit 2): retrying
cannot help until an operator changes a setting or a grant.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection

# AclOperation lives in confluent_kafka.admin at run time; its stubs just do not re-export it.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
)

from cdc.config import Settings
from cdc.errors import AccessDeniedError, ConfigError
from cdc.stream.admin import settling

log = logging.getLogger("cdc.sink")

__all__ = [
    "ConnectionErrors",
    "authorization_refusal",
    "connection_refusal",
    "missing_rights",
    "rotated_password",
    "sasl_password",
    "topic_rights",
    "with_password",
]

# Kafka's authorization error codes, and the resource each names.
TOPIC_AUTHORIZATION_FAILED: Final = 29
CLUSTER_AUTHORIZATION_FAILED: Final = 31
GROUP_AUTHORIZATION_FAILED: Final = 30
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
AUTHORIZATION_CODES: Final = frozenset(
    {
        TOPIC_AUTHORIZATION_FAILED,
        GROUP_AUTHORIZATION_FAILED,
        CLUSTER_AUTHORIZATION_FAILED,
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
_AUTHORIZATION_TEXT: Final = re.compile(r"(topic|group|cluster|transactional ?id) authorization failed", re.I)
# The consumer group of the exactly-once checkpoint reader: this prefix and a random suffix, per start.
CHECKPOINT_GROUP_PREFIX: Final = "outbox-cdc-checkpoint-"
_PRODUCE_TOPIC: Final = re.compile(r"ProduceRequest for (\S+) \[\d+\]")

# kafka-acls' names of the operations the pipeline may need.
_OPERATION_NAMES: Final = {
    "Write": AclOperation.WRITE,
    "Read": AclOperation.READ,
    "Describe": AclOperation.DESCRIBE,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
}


class ConnectionErrors:
    """librdkafka's ``error_cb``: keeps the last errors (code and text) for :func:`connection_refusal`.
    Called from librdkafka's threads through poll(); appending to a bounded deque needs no more locking."""

    def __init__(self, keep: int = 20) -> None:
        self._errors: deque[tuple[int, str]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def __call__(self, err: KafkaError) -> None:
        with self._lock:
            self._errors.append((err.code(), err.str()))

    def recent(self) -> list[tuple[int, str]]:
        with self._lock:
            return list(self._errors)


def sasl_password(settings: Settings) -> str | None:
    """The content of ``kafka_sasl_password_file`` (a trailing line break aside), or None without one."""
    if settings.kafka_sasl_password_file is None:
        return None
    path = Path(settings.kafka_sasl_password_file)
    try:
        password = path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(
            f"cannot read kafka_sasl_password_file {path}: {exc.strerror or exc}",
            key="kafka_sasl_password_file",
        ) from exc
    if not password:
        raise ConfigError(f"kafka_sasl_password_file {path} is empty", key="kafka_sasl_password_file")
    return password


def with_password(conf: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``conf`` with the SASL password of ``kafka_sasl_password_file`` as it reads now, when one is set."""
    password = sasl_password(settings)
    if password is not None:
        conf["sasl.password"] = password
    return conf


def rotated_password(settings: Settings, current: str | None) -> str | None:
    """The password of ``kafka_sasl_password_file`` when it is no longer ``current`` (rotated), else None. A
    file that cannot be read now is said, and taken for no rotation: the clients keep what they have."""
    if settings.kafka_sasl_password_file is None:
        return None
    try:
        password = sasl_password(settings)
    except ConfigError as exc:
        log.warning("%s", exc)
        return None
    return None if password == current else password


def _user(settings: Settings) -> str:
    return str(settings.kafka.extra.get("sasl.username") or "")


def _principal(settings: Settings) -> str:
    user = _user(settings)
    return f"User:{user}" if user else "the pipeline's principal"


def _env(key: str) -> str:
    return "CDC_KAFKA_" + key.upper().replace(".", "_")


def _first_broker(settings: Settings) -> tuple[str, int] | None:
    first = settings.kafka.bootstrap_servers.split(",")[0].strip()
    first = first.split("://", 1)[-1]
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def tls_probe(host: str, port: int, ca: str | None, timeout: float) -> str | None:
    """Python's TLS handshake with the broker: None when it verifies, else why it does not (OpenSSL's
    verify message: a host name mismatch, an unknown issuer). ``ca`` as librdkafka's ssl.ca.location."""
    if ca is not None and Path(ca).is_dir():
        context = ssl.create_default_context(capath=ca)
    else:
        context = ssl.create_default_context(cafile=ca)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc)
    except (OSError, ssl.SSLError) as exc:
        return f"no TLS handshake ({exc})"


def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether a TLS handshake (verifying nothing) succeeds on the port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def connection_refusal(
    settings: Settings, errors: Iterable[tuple[int, str]], timeout: float = 5.0
) -> AccessDeniedError | None:
    """The setting to fix when Kafka could not be reached because of who we are, or None when nothing says
    so (a broker that is down, a wrong address: the caller's own message)."""
    extra = settings.kafka.extra
    protocol = str(extra.get("security.protocol", "plaintext")).upper()
    broker = _first_broker(settings)
    for code, text in reversed(list(errors)):
        if code == KafkaError._AUTHENTICATION:
            if "Unsupported SASL mechanism" in text:
                offered = text.split("supported mechanisms:", 1)[-1].split("(", 1)[0].strip()
                return AccessDeniedError(
                    f"setting 'kafka.sasl.mechanism' ({_env('sasl.mechanism')}) is "
                    f"{extra.get('sasl.mechanism', 'GSSAPI')!r}, which the broker's listener does not take: "
                    f"set one it offers ({offered})",
                    key="kafka.sasl.mechanism",
                )
            return AccessDeniedError(
                f"Kafka refused the credentials of user {_user(settings)!r} "
                f"({extra.get('sasl.mechanism', 'GSSAPI')}): check 'kafka.sasl.username' and "
                f"'kafka.sasl.password' ({_env('sasl.password')})",
                key="kafka.sasl.password",
            )
        if "connecting to a PLAINTEXT broker listener" in text:
            return AccessDeniedError(
                f"setting 'kafka.security.protocol' ({_env('security.protocol')}) is {protocol}, but the "
                "broker's listener is plaintext: set PLAINTEXT or SASL_PLAINTEXT, or use its TLS listener",
                key="kafka.security.protocol",
            )
        if code == KafkaError._SSL or "certificate verify failed" in text:
            why = None if broker is None else tls_probe(*broker, extra.get("ssl.ca.location"), timeout)
            if why is not None and "hostname" in why.lower():
                return AccessDeniedError(
                    f"the broker's certificate does not name the host in 'kafka.bootstrap_servers' "
                    f"({why}): connect by a name the certificate holds",
                    key="kafka.bootstrap_servers",
                )
            return AccessDeniedError(
                f"the broker's certificate is not signed by a CA that 'kafka.ssl.ca.location' "
                f"({_env('ssl.ca.location')}) trusts ({why or text}): give the CA that signed it",
                key="kafka.ssl.ca.location",
            )
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT") and broker is not None and speaks_tls(*broker, timeout):
        return AccessDeniedError(
            f"setting 'kafka.security.protocol' ({_env('security.protocol')}) is {protocol}, but the broker "
            f"at {broker[0]}:{broker[1]} speaks TLS: set SSL or SASL_SSL (with ssl.ca.location)",
            key="kafka.security.protocol",
        )
    return None


def _grant(settings: Settings, operation: str, resource: str, name: str, literal: bool = False) -> str:
    option = {
        "Topic": "--topic",
        "Group": "--group",
        "TransactionalId": "--transactional-id",
        "Cluster": "--cluster",
    }[resource]
    target = option if resource == "Cluster" else f"{option} {name}"
    if (resource == "Group" and not literal) or (resource == "TransactionalId" and not name):
        target = f"{option} {name or 'outbox-cdc.'} --resource-pattern-type prefixed"
    return (
        f"kafka-acls.sh --bootstrap-server ... --add --allow-principal {_principal(settings)} "
        f"--operation {operation} {target}"
    )


def refusal_for_right(
    settings: Settings,
    operation: str,
    resource: str,
    name: str,
    why: str,
    lsn: int | None = None,
    *,
    literal: bool = False,
) -> AccessDeniedError:
    """The grant to make; a group's is a prefix (the checkpoint readers' groups are named per start) unless
    ``literal``."""
    right = f"{operation} on {resource}" + (f":{name}" if name else "")
    return AccessDeniedError(
        f"Kafka denies {_principal(settings)} the right {right} ({why}). Grant it: "
        f"{_grant(settings, operation, resource, name, literal)}",
        right=right,
        lsn=lsn,
    )


def authorization_refusal(
    settings: Settings,
    errors: Iterable[object],
    *,
    topic: str | None = None,
    operation: str = "Write",
    transactional_id: str | None = None,
    lsn: int | None = None,
) -> AccessDeniedError | None:
    """The grant to make when one of ``errors`` (KafkaErrors, or their texts) is Kafka's authorization
    failure; the topic is taken from whichever error names it (a delivery report does not, the producer's
    fatal error does)."""
    texts = [(e.code() if isinstance(e, KafkaError) else None, _text(e)) for e in errors]
    denial = None
    for code, text in texts:
        match = _AUTHORIZATION_TEXT.search(text)
        if code in AUTHORIZATION_CODES or match is not None:
            denial = code, (match.group(1).lower().replace(" ", "") if match else "")
            break
    if denial is None:
        return None
    code, kind = denial
    if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED or kind == "transactionalid":
        return refusal_for_right(
            settings, "Write", "TransactionalId", transactional_id or "", "exactly-once delivery", lsn
        )
    if code == GROUP_AUTHORIZATION_FAILED or kind == "group":
        # The checkpoint reader is a consumer, and librdkafka looks up a consumer's group coordinator
        # even for one that only assigns partitions: its group is named per start.
        return refusal_for_right(
            settings, "Describe", "Group", CHECKPOINT_GROUP_PREFIX, "reading the checkpoint topic", lsn
        )
    if code == CLUSTER_AUTHORIZATION_FAILED or kind == "cluster":
        return refusal_for_right(
            settings,
            "IdempotentWrite",
            "Cluster",
            "",
            "the idempotent producer (or Write on the topics)",
            lsn,
        )
    named = (m.group(1) for _, text in texts if (m := _PRODUCE_TOPIC.search(text)))
    why = "producing to it" if operation == "Write" else "reading it"
    return refusal_for_right(settings, operation, "Topic", next(named, topic or ""), why, lsn)


def _text(error: object) -> str:
    return error.str() if isinstance(error, KafkaError) else str(error)


def topic_rights(settings: Settings) -> dict[str, tuple[str, ...]]:
    """The rights asked for at the start, on the topics known then: the dead-letter topic (written to, its
    record limit read) and, exactly once, the checkpoint topic (read at every start, written in every
    transaction). The event topics are met as events arrive: their rights are asked for then."""
    needs: dict[str, tuple[str, ...]] = {settings.dlq_topic: ("Write", "DescribeConfigs")}
    if settings.delivery == "exactly-once":
        needs[settings.checkpoint_topic] = ("Read", "Write")
    return needs


def missing_rights(
    admin: AdminClient, settings: Settings, needs: Mapping[str, Iterable[str]], timeout: float
) -> AccessDeniedError | None:
    """The first right the pipeline lacks on topics that exist (``needs``: topic -> kafka-acls operation
    names), as Kafka's Metadata says (KIP-430); None when it holds them all. A topic that does not exist yet
    is not asked about: its creation is (Create)."""
    if not needs:
        return None
    futures = admin.describe_topics(
        TopicCollection(list(needs)), request_timeout=timeout, include_authorized_operations=True
    )
    for topic, future in futures.items():
        try:
            description: Any = future.result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == TOPIC_AUTHORIZATION_FAILED:
                # Kafka hides a topic from a principal without any right on it; Write or Read imply Describe.
                return refusal_for_right(
                    settings, next(iter(needs[topic])), "Topic", topic, "needed by cdc run"
                )
            if settling(err):
                raise  # a broker that is starting: the caller asks again (cdc.stream.admin.ask)
            continue  # unknown topic (created later), or an error the stream meets again
        if description.authorized_operations is None:
            continue  # a broker that does not say (before KIP-430): the requests will tell
        allowed = set(description.authorized_operations)
        if AclOperation.ALL in allowed:
            continue
        for operation in needs[topic]:
            if _OPERATION_NAMES[operation] not in allowed:
                return refusal_for_right(settings, operation, "Topic", topic, "needed by cdc run")
    return None

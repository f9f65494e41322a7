"""Kafka users of a test's own on the secure stack: a SCRAM user with exactly the ACLs the test grants,
removed afterwards (`kafka_user` fixture). The stack's admin user makes them, through the Admin API."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.kafka_admin import settled

RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.BROKER,  # librdkafka's name for the cluster resource
}


@dataclass(frozen=True)
class Grant:
    """``operations`` (kafka-acls names: Write, Describe, ...) on a resource, by literal name or prefix."""

    resource: str  # a RESOURCES key
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False

    def bindings(self, principal: str) -> list[AclBinding]:
        pattern = ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL
        name = "kafka-cluster" if self.resource == "cluster" else self.name
        return [
            AclBinding(
                RESOURCES[self.resource],
                name,
                pattern,
                principal,
                "*",
                _operation(op),
                AclPermissionType.ALLOW,
            )
            for op in self.operations
        ]


def _operation(name: str) -> AclOperation:
    # kafka-acls spells them DescribeConfigs, IdempotentWrite; the enum DESCRIBE_CONFIGS, IDEMPOTENT_WRITE.
    snake = "".join("_" + c if c.isupper() else c for c in name).lstrip("_").upper()
    return AclOperation[snake]


@dataclass(frozen=True)
class KafkaUser:
    name: str
    password: str

    def env(self) -> dict[str, str]:
        """The `cdc` variables that connect as this user (the other security settings stay the stack's)."""
        return {"CDC_KAFKA_SASL_USERNAME": self.name, "CDC_KAFKA_SASL_PASSWORD": self.password}


def _check(futures: dict, what: str) -> None:
    for key, future in futures.items():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            raise AssertionError(f"{what} {key}: {exc.args[0]}") from exc


def revoke(admin: AdminClient, bindings: list[AclBinding], *, wait: bool = True) -> None:
    """Delete exactly these ACLs; with ``wait``, until the broker says they are gone."""
    filters = [
        AclBindingFilter(
            b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type
        )
        for b in bindings
    ]
    if wait:
        settled(lambda _left: _check(admin.delete_acls(filters), "could not revoke"), "revoke ACLs")
    else:
        admin.delete_acls(filters)


@pytest.fixture
def kafka_user(kafka_admin: AdminClient) -> Iterator[Callable[..., KafkaUser]]:
    """`kafka_user(*grants)`: a new SCRAM-SHA-512 user holding exactly `grants`; gone after the test."""
    if os.environ.get("CDC_STACK_SECURE") != "1":
        pytest.skip("plain stack: this test is for the secure stack (make test-secure)")
    made: list[tuple[KafkaUser, list[AclBinding]]] = []

    def make(*grants: Grant) -> KafkaUser:
        user = KafkaUser(f"user_{uuid.uuid4().hex[:12]}", secrets.token_urlsafe(18))
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        _check(
            kafka_admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user.name, info, user.password.encode())]
            ),
            "could not make SCRAM user",
        )
        bindings = [b for g in grants for b in g.bindings(f"User:{user.name}")]
        made.append((user, bindings))
        if bindings:
            settled(lambda _left: _check(kafka_admin.create_acls(bindings), "could not grant"), "grant ACLs")
        return user

    yield make
    for user, bindings in made:
        if bindings:
            revoke(kafka_admin, bindings, wait=False)
        kafka_admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion(user.name, ScramMechanism.SCRAM_SHA_512)]
        )

"""docker-compose.yml cannot run here (no Docker engine); this keeps it valid and consistent with the local
stack that `make stack-up` starts."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def stack_default(name: str) -> str:
    match = re.search(rf"^\s*{name}=\$\{{[A-Z_]+:-(\d+)\}}", (ROOT / "stack/stack.sh").read_text(), re.M)
    assert match, f"{name} not found in stack/stack.sh"
    return match.group(1)


def test_services_are_postgres_kafka_registry_and_cdc():
    assert set(load_compose()["services"]) == {"postgres", "kafka", "apicurio", "cdc"}


def test_postgres_runs_with_logical_decoding_on_the_stack_port():
    pg = load_compose()["services"]["postgres"]
    args = pg["command"]
    assert "wal_level=logical" in args
    assert any(a.startswith("max_replication_slots=") and int(a.split("=")[1]) >= 10 for a in args)
    assert any(a.startswith("max_wal_senders=") and int(a.split("=")[1]) >= 10 for a in args)
    assert f"127.0.0.1:{stack_default('PG_PORT')}:5432" in pg["ports"]


def test_kafka_is_kraft_on_the_stack_port():
    kafka = load_compose()["services"]["kafka"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:4.")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    port = stack_default("KAFKA_PORT")
    assert f"127.0.0.1:{port}:{port}" in kafka["ports"]
    assert f"127.0.0.1:{port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]).lower() == "false"


def test_registry_is_the_stack_apicurio_on_the_stack_port():
    registry = load_compose()["services"]["apicurio"]
    pom = (ROOT / "stack/registry/pom.xml").read_text()
    version = re.search(r"<apicurio.version>([^<]+)</apicurio.version>", pom)
    assert version, "apicurio.version not found in stack/registry/pom.xml"
    image, _, tag = registry["image"].partition(":")
    assert image.startswith("apicurio/apicurio-registry")
    assert tag == version.group(1), "compose and the local stack must run the same Apicurio release"
    assert f"127.0.0.1:{stack_default('REGISTRY_PORT')}:8080" in registry["ports"]
    assert str(registry["environment"]["AUTH_ENABLED"]).lower() == "false"


def test_cdc_service_is_built_here_and_wired_to_all():
    compose = load_compose()
    cdc = compose["services"]["cdc"]
    assert (ROOT / cdc["build"]["dockerfile"]).is_file()
    env = cdc["environment"]
    assert "@postgres:5432/" in env["CDC_DATABASE_URL"]
    internal = env["CDC_KAFKA_BOOTSTRAP_SERVERS"]
    assert (
        f"INTERNAL://{internal}" in compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert env["CDC_SCHEMA_REGISTRY_URL"] == "http://apicurio:8080/apis/ccompat/v7"
    assert set(cdc["depends_on"]) == {"postgres", "kafka", "apicurio"}
    dockerfile = (ROOT / cdc["build"]["dockerfile"]).read_text()
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.M), "the image must not run as root"

"""docker-compose.yml cannot run here (no Docker engine); this keeps it valid and consistent with the local
stack that `make stack-up` starts: the same PostgreSQL major version and settings, the same Kafka release and
broker settings, the same registry, on the same ports (the differences it keeps are named in its header)."""

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


# Set by stack.sh for its own cluster on loopback (paths, the port, the log's shape), not its behaviour.
PG_LOCAL_ONLY = {"listen_addresses", "port", "unix_socket_directories", "log_min_messages", "log_line_prefix"}
# The broker's identity and listeners: compose has its own (a container's network), checked separately.
KAFKA_LOCAL_ONLY = {
    "process.roles",
    "node.id",
    "controller.quorum.bootstrap.servers",
    "listeners",
    "advertised.listeners",
    "controller.listener.names",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "log.dirs",
}


def stack_postgres_settings() -> dict[str, str]:
    """The settings stack.sh appends to its cluster's postgresql.conf."""
    text = (ROOT / "stack/stack.sh").read_text()
    block = text[text.index("# --- outbox CDC local stack ---") :]
    block = block[: block.index("\nEOF")]
    settings = dict(re.findall(r"^(\w+) = '?([^'\n]*?)'?$", block, re.M))
    assert "wal_level" in settings, "the stack's postgresql.conf block was not found in stack/stack.sh"
    return settings


def compose_postgres_settings() -> dict[str, str]:
    args = load_compose()["services"]["postgres"]["command"]
    return dict(a.split("=", 1) for a in args if "=" in a)


def stack_kafka_settings() -> dict[str, str]:
    text = (ROOT / "stack/kafka/server.properties.in").read_text()
    return dict(re.findall(r"^([a-z][\w.]*)=(.*)$", text, re.M))


def test_postgres_is_the_stacks_major_version():
    default = re.search(r"^PG_DEFAULT_VERSION=(\d+)$", (ROOT / "stack/stack.sh").read_text(), re.M)
    assert default, "PG_DEFAULT_VERSION not found in stack/stack.sh"
    image, _, tag = load_compose()["services"]["postgres"]["image"].partition(":")
    assert image == "postgres"
    assert tag.split(".")[0] == default.group(1), (
        "compose and the local stack must run the same major version"
    )


def test_postgres_has_every_setting_of_the_stack():
    compose = compose_postgres_settings()
    for key, value in stack_postgres_settings().items():
        if key in PG_LOCAL_ONLY:
            continue
        assert compose.get(key) == value, (
            f"{key}: the stack sets {value!r}, docker-compose.yml {compose.get(key)!r}"
        )
    assert compose["track_commit_timestamp"] == "on", "cdc recover and cdc audit need commit timestamps"


def test_kafka_is_the_stacks_release():
    pom = (ROOT / "stack/kafka/pom.xml").read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert version, "kafka.version not found in stack/kafka/pom.xml"
    image, _, tag = load_compose()["services"]["kafka"]["image"].partition(":")
    assert image == "apache/kafka"
    assert tag == version.group(1), "compose and the local stack must run the same Kafka release"


def test_kafka_has_every_broker_setting_of_the_stack():
    env = {k: str(v).lower() for k, v in load_compose()["services"]["kafka"]["environment"].items()}
    for key, value in stack_kafka_settings().items():
        if key in KAFKA_LOCAL_ONLY:
            continue
        name = "KAFKA_" + key.upper().replace(".", "_")
        assert env.get(name) == value.lower(), (
            f"{key}: the stack sets {value!r}, docker-compose.yml {name}={env.get(name)!r}"
        )


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

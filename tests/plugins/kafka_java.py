"""Apache Kafka's own Java producer, as the reference of where a key lands: the `java_producer` fixture.

It builds tests/java/key-partitions (Maven, kafka-clients at the broker's version, Java 17) once, as
tests/plugins/avro_java.py builds its tool. `java_producer.partitions(bootstrap, topic, keys)` sends each key
(as StringSerializer writes it) with the Java producer's default partitioner and returns the partition each
was acknowledged on. `java_serde.read(bootstrap, topic, registry, count)` reads a topic as a Java service
would, with Apicurio Registry's Avro serde (tests/java/avro-serde). Without Java 17 or Maven a developer's
run skips with the reason; under CI=true that is a failure.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from tests.plugins.avro_java import build_java_tool

MAIN_CLASS = "outbox.cdc.interop.KeyPartitions"
SERDE_CLASS = "outbox.cdc.interop.SerdeConsume"


class JavaProducer:
    def __init__(self, java: str, classpath: list[str]) -> None:
        self.java, self.classpath = java, classpath

    def partitions(self, bootstrap: str, topic: str, keys: Sequence[str]) -> list[int]:
        argv = [self.java, "-cp", ":".join(self.classpath), MAIN_CLASS, bootstrap, topic]
        stdin = "".join(f"{key.encode().hex()}\n" for key in keys)
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"KeyPartitions exited {done.returncode}:\n{done.stderr[-3000:]}"
        lines = done.stdout.split()
        assert len(lines) == len(keys), f"KeyPartitions answered {len(lines)} of {len(keys)}:\n{done.stderr}"
        return [int(line) for line in lines]


@pytest.fixture(scope="session")
def java_producer() -> JavaProducer:
    return JavaProducer(*build_java_tool("key-partitions"))


class JavaSerde:
    """tests/java/avro-serde: KafkaConsumer with Apicurio's AvroKafkaDeserializer (Confluent-compatible)."""

    def __init__(self, java: str, classpath: list[str]) -> None:
        self.java, self.classpath = java, classpath

    def read(
        self, bootstrap: str, topic: str, registry: str, count: int
    ) -> dict[tuple[int, int], tuple[str, bytes]]:
        """(partition, offset) -> (the writer schema's full name, the record written again with it)."""
        argv = [
            self.java,
            "-cp",
            ":".join(self.classpath),
            SERDE_CLASS,
            bootstrap,
            topic,
            registry,
            str(count),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, f"SerdeConsume exited {done.returncode}:\n{done.stderr[-3000:]}"
        out = {}
        for line in done.stdout.splitlines():
            partition, offset, schema, body = line.split("\t")
            out[int(partition), int(offset)] = (schema, bytes.fromhex(body))
        return out


@pytest.fixture(scope="session")
def java_serde() -> JavaSerde:
    return JavaSerde(*build_java_tool("avro-serde"))

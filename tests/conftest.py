"""Service fixtures live in plugin modules; this file only registers them."""

pytest_plugins = [
    "tests.plugins.services",
    "tests.plugins.postgres",
    "tests.plugins.kafka",
    "tests.plugins.kafka_acl",
    "tests.plugins.registry",
    "tests.plugins.proxy",
    "tests.plugins.pipeline",
    "tests.plugins.pgcluster",
    "tests.plugins.avro_reference",
    "tests.plugins.avro_java",
    "tests.plugins.kafka_java",
    "tests.plugins.fastpath",
    "tests.plugins.podman",
    "tests.plugins.helm",
    "tests.plugins.pods",
    "tests.plugins.jaeger",
]

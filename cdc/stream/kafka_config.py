"""What every Kafka client of the pipeline is configured with: the producer's settings (the project's
defaults, then the user's ``kafka.*`` keys, then the settings the guarantees rest on, which the user cannot
override), and the connection and security keys that the admin client, the checkpoint reader and the
dead-letter tools take too.
"""

from __future__ import annotations

from typing import Any

from cdc.config import Settings
from cdc.stream.access import with_password

# Settings the pipeline's guarantees rest on; config validation refuses attempts to override them.
#
# One request in flight per broker connection: with more, a request R2 can be accepted while an earlier R1 to
# the same partition failed with a retriable error (a partition whose leader is not serving yet: a topic
# created a moment ago, a leader that moved). A broker takes any first sequence number from a producer id it
# has no state for on that partition, so it appends R2 without R1; librdkafka then counts R1's records as
# "implicitly acked by subsequent batch success" and reports them delivered. They never reach the log. With
# one request in flight, R1 is retried before anything after it is sent.
FIXED_PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 1,
    # A batch the broker refuses (too large, invalid) makes the producer stop instead of sending the next
    # one: nothing of a partition is appended behind a refused record, so a replay keeps each key in order.
    # The pipeline then replays and dead-letters the culprit (cdc.stream.refusals).
    "enable.gapless.guarantee": True,
}
# Below this many bytes a topic's max.message.bytes may refuse what the producer sends: its records are
# checked before they are produced, and the producer's batches are made to fit it.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000


def producer_config(settings: Settings) -> dict[str, Any]:
    """The producer's librdkafka configuration: our defaults, then the user's `kafka.*` keys, then the
    settings that guarantees depend on."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        "compression.type": "lz4",
        "linger.ms": 10,
        "batch.num.messages": 10_000,
        "batch.size": 1_000_000,
        # Bounded in count and bytes: the in-flight window is what a restart may publish twice.
        "queue.buffering.max.messages": settings.max_in_flight,
        "queue.buffering.max.kbytes": settings.max_in_flight_mb * 1024,
        "message.timeout.ms": int(settings.delivery_timeout * 1000),
        "reconnect.backoff.ms": int(settings.backoff_initial * 1000),
        "reconnect.backoff.max.ms": int(settings.backoff_max * 1000),
        "client.id": "outbox-cdc",
    }
    conf.update(settings.kafka.extra)
    conf.update(FIXED_PRODUCER_CONFIG)
    conf["partitioner"] = settings.partitioner
    return with_password(conf, settings)


# The librdkafka keys of how to reach and trust the brokers, which every client of the pipeline takes (the
# admin client, the checkpoint reader, the dead-letter tools), not only the producer: TLS, SASL and
# OAUTHBEARER (enable.ssl.certificate.verification, enable.sasl.oauthbearer.unsecure.jwt too), the socket.
CONNECTION_KEYS = (
    "security.",
    "sasl.",
    "ssl.",
    "ssl_",
    "enable.ssl.",
    "enable.sasl.",
    "https.",
    "client.",
    "socket.",
    "broker.address.",
    "connections.max.",
    "reconnect.",
    "api.version.",
    "metadata.recovery.",
    "plugin.library.",  # a plugin may be what authenticates
)


def admin_config(settings: Settings) -> dict[str, Any]:
    """Connection and security settings only: producer tuning keys mean nothing to an admin client."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka.bootstrap_servers}
    for key, value in settings.kafka.extra.items():
        if key.startswith(CONNECTION_KEYS):
            conf[key] = value
    return with_password(conf, settings)

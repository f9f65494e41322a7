"""What a start checks before the first session, changing nothing: Kafka answers, the dead-letter topic is
there, the pipeline has the rights it will need on the topics that exist, the registry takes its credentials.

Kafka is asked in short requests, so that a stop requested meanwhile is seen between two (a start that waits
on an unreachable broker ends within a second of SIGTERM); all of them together wait up to
``startup_timeout``, counted from the start of the run, which PostgreSQL's wait at the first session shares.
A refusal closes the sink at once, while Python runs: a librdkafka thread still calling back (a broker that
keeps refusing the credentials) crashed the interpreter's own shutdown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cdc.config import Settings
from cdc.errors import BrokerUnreachableError, CdcError
from cdc.stream.access import topic_rights
from cdc.stream.sink import KafkaSink
from cdc.stream.waits import StopRequested

if TYPE_CHECKING:
    from cdc.avro.registry import SchemaRegistry

BROKER_ASK = 0.5  # seconds one metadata request may take at start: a stop request is seen between two


def start_checks(
    settings: Settings,
    sink: KafkaSink,
    registry: SchemaRegistry | None,
    started: float,
    *,
    stopping: Callable[[], bool],
) -> None:
    """Refuse to start (a CdcError) when Kafka does not answer within startup_timeout of ``started``, or a
    right or credential is missing; StopRequested when a stop comes first."""
    s = settings
    deadline = started + s.startup_timeout
    try:
        while True:
            try:
                sink.check_broker(max(0.1, min(BROKER_ASK, deadline - time.monotonic())))
                break
            except BrokerUnreachableError as exc:
                if time.monotonic() >= deadline:
                    raise BrokerUnreachableError(
                        f"Kafka at {s.kafka.bootstrap_servers} did not answer within startup_timeout = "
                        f"{s.startup_timeout:g} s ({exc.__cause__ or exc}). Check kafka.bootstrap_servers "
                        "(CDC_KAFKA_BOOTSTRAP_SERVERS) and that the broker is up"
                    ) from exc
            if stopping():
                raise StopRequested
        sink.ensure_dead_letter_topic(s.dlq_topic)
        sink.check_rights(topic_rights(s), s.startup_timeout)
        if registry is not None:
            registry.check_access()
    except CdcError:
        sink.close()
        raise

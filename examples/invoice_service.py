"""An example downstream service: exactly one invoice per OrderPlaced, under at-least-once delivery.

    . .stack/env                                  # CDC_DATABASE_URL, CDC_KAFKA_BOOTSTRAP_SERVERS
    cdc consumer setup                            # processed_events in the service's database
    python -m examples.invoice_service --topic outbox.event.order

The handler only writes its business effect, with the connection it is handed: `cdc.consumer` runs it in
the same transaction as the `processed_events` row of the event, and commits the Kafka offset after that
transaction. So a redelivered OrderPlaced (a pipeline restart, a rebalance, a crash before the offset commit)
is acknowledged without a second invoice. The `invoices` table deliberately has no unique constraint on
`order_id`: the guard table is what keeps invoices single here (a real service may add one as a second line
of defence; it would turn a missing guard into errors instead of duplicates).

The service reads OrderPlaced as v1 (`reader_versions`), so producers moving to v2 (a coupon) change nothing
here. An order whose total is not positive cannot be invoiced: a `PermanentError`, so it goes to the
service's dead-letter topic (`<name>.dlq`, created at start when missing) and the next orders go on.
SIGTERM finishes the current record, commits, leaves the group and exits 0.

Settings: `--database-url` or INVOICE_DATABASE_URL (else CDC_DATABASE_URL), `--bootstrap-servers` or
CDC_KAFKA_BOOTSTRAP_SERVERS. On a secured cluster, the connection's settings come from the environment as
`cdc run`'s do, with the service's own user: INVOICE_KAFKA_<KEY> (else CDC_KAFKA_<KEY>) for SECURITY_PROTOCOL,
SASL_MECHANISM, SASL_USERNAME, SASL_PASSWORD and SSL_CA_LOCATION, and `--schema-registry-ca-file` or
CDC_SCHEMA_REGISTRY_CA_FILE for an HTTPS registry. On the secure stack (`CDC_STACK_SECURE=1 make stack-up`)
that user is `consumer`, whose password .stack/env holds:

    INVOICE_KAFKA_SASL_USERNAME=consumer INVOICE_KAFKA_SASL_PASSWORD=$CDC_STACK_KAFKA_CONSUMER_PASSWORD \
        python -m examples.invoice_service --topic outbox.event.order --name consumer_invoices

(its ACLs cover groups named consumer_* or group_*, and topics named outbox.*, cdc_*, dlq_* or ckpt_*: name
the dead-letter topic with `--dlq-topic dlq_invoices`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from cdc.consumer import (
    BatchHandler,
    Event,
    EventDeserializer,
    Handler,
    IdempotentConsumer,
    PermanentError,
    RetryPolicy,
)
from cdc.consumer.processed import apply_setup, parse_table
from cdc.errors import CdcError
from cdc.logs import configure_logging
from cdc.stream.admin import ask

log = logging.getLogger("invoice_service")
SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def invoices_ddl(table: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (\n"
        "    invoice_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n"
        "    order_id     text   NOT NULL,\n"
        "    customer_id  text   NOT NULL,\n"
        "    amount_cents bigint NOT NULL,\n"
        "    currency     text   NOT NULL,\n"
        "    created_at   timestamptz NOT NULL DEFAULT now()\n"
        ")"
    ).format(sql.Identifier(table))


def invoice_handler(table: str = "invoices") -> Handler:
    insert = sql.SQL(
        "INSERT INTO {} (order_id, customer_id, amount_cents, currency) VALUES (%s, %s, %s, %s)"
    ).format(sql.Identifier(table))

    def create_invoice(conn: psycopg.Connection[Any], event: Event) -> None:
        if event.event_type != "OrderPlaced":
            return  # other events of the order topic concern other services: acknowledged, no effect
        order = event.payload
        if order["amount_cents"] <= 0:
            raise PermanentError(
                "an order with a total of zero or less cannot be invoiced", reason="no_total"
            )
        conn.execute(
            insert, (order["order_id"], order["customer_id"], order["amount_cents"], order["currency"])
        )
        log.info("invoiced order %s (event %s)", order["order_id"], event.id)

    return create_invoice


def invoice_batch_handler(table: str = "invoices") -> BatchHandler:
    """The same effect for a batch's new events at once: one executemany (which psycopg pipelines)."""
    insert = sql.SQL(
        "INSERT INTO {} (order_id, customer_id, amount_cents, currency) VALUES (%s, %s, %s, %s)"
    ).format(sql.Identifier(table))

    def create_invoices(conn: psycopg.Connection[Any], events: list[Event]) -> None:
        rows = []
        for event in events:
            if event.event_type != "OrderPlaced":
                continue
            order = event.payload
            if order["amount_cents"] <= 0:
                # The whole batch rolls back; the consumer finds this event and dead-letters it alone.
                raise PermanentError(
                    "an order with a total of zero or less cannot be invoiced", reason="no_total"
                )
            rows.append((order["order_id"], order["customer_id"], order["amount_cents"], order["currency"]))
        with conn.cursor() as cur:
            cur.executemany(insert, rows)
        log.info("invoiced %d orders", len(rows))

    return create_invoices


# The connection's security settings: librdkafka key of each CDC_KAFKA_<KEY> / INVOICE_KAFKA_<KEY>.
SECURITY_KEYS = ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location")


def security_config() -> dict[str, str]:
    """The service's own settings (INVOICE_KAFKA_*) over those it shares with `cdc run` (CDC_KAFKA_*)."""
    config = {}
    for key in SECURITY_KEYS:
        name = key.upper().replace(".", "_")
        value = os.environ.get(f"INVOICE_KAFKA_{name}") or os.environ.get(f"CDC_KAFKA_{name}")
        if value:
            config[key] = value
    return config


def ensure_dlq_topic(bootstrap: str, topic: str, wait: float = 30.0) -> None:
    """The service's dead-letter topic, created if missing. A broker that is starting answers "not yet" for a
    moment (a stack and its services started together): asked again for up to ``wait`` seconds."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **security_config()})

    def create(left: float) -> None:
        if topic in admin.list_topics(timeout=min(left, 10)).topics:
            return
        future = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic]
        try:
            future.result(timeout=left)
        except KafkaException as exc:
            # Replicas of the service start together: one of them creates it.
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    ask(create, what=f"the dead-letter topic {topic}", bound=wait)


def main(
    argv: list[str] | None = None, handler: Handler | None = None, batch_handler: BatchHandler | None = None
) -> int:
    parser = argparse.ArgumentParser(description="One invoice per OrderPlaced, exactly once.")
    parser.add_argument("--topic", action="append", help="repeatable; default outbox.event.order")
    parser.add_argument("--name", default="invoice-service", help="consumer name (and default group id)")
    parser.add_argument("--group", help="Kafka consumer group (default: --name)")
    parser.add_argument("--dlq-topic", help="the service's dead-letter topic (default: <name>.dlq)")
    parser.add_argument("--invoices-table", default="invoices")
    parser.add_argument("--processed-table", default="public.processed_events")
    parser.add_argument("--database-url", default=os.environ.get("INVOICE_DATABASE_URL"))
    parser.add_argument("--bootstrap-servers", default=os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS"))
    parser.add_argument("--schemas-dir", default=str(SCHEMAS))
    parser.add_argument(
        "--schema-registry-url",
        default=os.environ.get("CDC_SCHEMA_REGISTRY_URL"),
        help="for events in the confluent framing (default: CDC_SCHEMA_REGISTRY_URL)",
    )
    parser.add_argument(
        "--schema-registry-ca-file",
        default=os.environ.get("CDC_SCHEMA_REGISTRY_CA_FILE"),
        help="the CA of an HTTPS registry (default: CDC_SCHEMA_REGISTRY_CA_FILE)",
    )
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument("--retry-attempts", type=int, default=5, help="attempts per record on RetryableError")
    parser.add_argument("--on-retries-exhausted", choices=["stop", "dead_letter"], default="stop")
    parser.add_argument(
        "--batch", action="store_true", help="a batch handler: each batch's invoices in one executemany"
    )
    parser.add_argument(
        "-X", dest="kafka", action="append", default=[], metavar="KEY=VALUE", help="librdkafka setting"
    )
    args = parser.parse_args(argv)
    configure_logging("INFO")
    database_url = args.database_url or os.environ.get("CDC_DATABASE_URL")
    if not database_url or not args.bootstrap_servers:
        parser.error("set INVOICE_DATABASE_URL (or CDC_DATABASE_URL) and CDC_KAFKA_BOOTSTRAP_SERVERS")
    processed, table = parse_table(args.processed_table), args.invoices_table
    kafka_config = {**security_config(), **dict(item.split("=", 1) for item in args.kafka)}
    dlq_topic = args.dlq_topic or f"{args.name}.dlq"
    try:
        # Deployment steps, done at start to keep the example one command: the service's own tables
        # (`cdc consumer setup` creates processed_events the same way) and its dead-letter topic.
        apply_setup(database_url, processed)
        with psycopg.connect(database_url) as conn:  # one transaction; replicas starting together queue
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"invoices:{args.invoices_table}",))
            conn.execute(invoices_ddl(args.invoices_table))
        ensure_dlq_topic(args.bootstrap_servers, dlq_topic)
        IdempotentConsumer(
            name=args.name,
            group_id=args.group,
            topics=args.topic or ["outbox.event.order"],
            handler=None if args.batch else handler or invoice_handler(table),
            batch_handler=(batch_handler or invoice_batch_handler(table)) if args.batch else None,
            database_url=database_url,
            bootstrap_servers=args.bootstrap_servers,
            deserializer=EventDeserializer(
                args.schemas_dir,
                schema_registry_url=args.schema_registry_url,
                schema_registry_ca_file=args.schema_registry_ca_file,
                reader_versions={"OrderPlaced": 1},
            ),
            dlq_topic=dlq_topic,
            kafka_config=kafka_config,
            processed_table=processed,
            shutdown_timeout=args.shutdown_timeout,
            retry=RetryPolicy(attempts=args.retry_attempts),
            on_retries_exhausted=args.on_retries_exhausted,
        ).serve()
    except CdcError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

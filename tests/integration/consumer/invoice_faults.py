"""The example invoice service with faults injected, for test_idempotent_consumer.py beside it.

`python -m tests.integration.consumer.invoice_faults <examples.invoice_service arguments>`. The fault is
chosen by the order id's prefix (OrderPlaced payloads), after the invoice row is written, i.e. between the
effect and the commit:

- `exit-`:  the first time (a marker file per event in FAULT_DIR), os._exit(7): dead mid-transaction
- `raise-`: the first time, a RuntimeError: the consumer rolls back and the process exits 1
- `flaky-`: RetryableError on attempts 1 and 2, success on the 3rd
- `down-`:  RetryableError on every attempt
- `bug-`:   a RuntimeError every time
- `slow-`:  logs "slow handler started" and sleeps FAULT_SLOW seconds before finishing
- `divzero-`: the first time, runs `SELECT 1/0` (a database error that does not come back, like a
  serialization failure); `fetch-`: runs `SELECT 1` and fetches its row. Both turn a DivisionByZero into a
  PermanentError (a handler that maps a database error to a dead letter). In pipeline mode the division's
  error reaches the next fetch, i.e. a later record's handler

With `--batch` the service's batch handler writes a batch's invoices first, then the faults of its events
are injected in order.

FAULT_OWN_IDS=1 makes the deserializer give each event the id `own-<its id header>`, as a service's own
deserializer may (the consumer must then guard by the events' ids, not the headers').

FAULT_DELAY_MS slows every event (rebalances then happen mid-stream). INVOICE_NO_GUARD=1 replaces the
processed_events guard with one that always says "new", to show that the tests fail without it."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

import cdc.consumer
import cdc.consumer.batches
import cdc.consumer.records
from cdc.consumer import Event, PermanentError, RetryableError
from examples import invoice_service

log = logging.getLogger("invoice_faults")
attempts: Counter[str] = Counter()


def faults() -> Any:
    """``inject(conn, event)``: the fault the event's order id asks for, after its invoice is written."""
    fault_dir = Path(os.environ.get("FAULT_DIR", "/tmp"))
    delay = float(os.environ.get("FAULT_DELAY_MS", "0")) / 1000

    def first_time(event: Event) -> bool:
        marker = fault_dir / f"fault-{event.id}"
        if marker.exists():
            return False
        marker.touch()
        return True

    def inject(conn: psycopg.Connection[Any], event: Event) -> None:
        order_id = str(event.payload.get("order_id", ""))
        attempts[event.id] += 1
        if delay:
            time.sleep(delay)
        if order_id.startswith("exit-") and first_time(event):
            log.warning("injected: os._exit(7) after the invoice of %s, before the commit", order_id)
            sys.stderr.flush()
            os._exit(7)
        if order_id.startswith("raise-") and first_time(event):
            raise RuntimeError(f"injected crash after the invoice of {order_id}")
        if order_id.startswith("bug-"):
            raise RuntimeError(f"injected bug in the handler of {order_id}")
        if order_id.startswith("down-"):
            raise RetryableError(f"injected outage, attempt {attempts[event.id]}")
        if order_id.startswith("flaky-") and attempts[event.id] < 3:
            raise RetryableError(f"injected transient failure {attempts[event.id]} for {order_id}")
        if order_id.startswith(("divzero-", "fetch-")):
            try:
                if order_id.startswith("fetch-"):
                    conn.execute("SELECT 1").fetchone()
                elif first_time(event):
                    conn.execute("SELECT 1/0")
            except psycopg.errors.DivisionByZero as exc:
                raise PermanentError(f"division by zero for {order_id}", reason="division") from exc
        if order_id.startswith("slow-"):
            log.info("slow handler started for %s", order_id)
            time.sleep(float(os.environ.get("FAULT_SLOW", "3")))
            log.info("slow handler finished for %s", order_id)

    return inject


def faulty(table: str) -> Any:
    create_invoice, inject = invoice_service.invoice_handler(table), faults()

    def handler(conn: psycopg.Connection[Any], event: Event) -> None:
        create_invoice(conn, event)
        inject(conn, event)

    return handler


def faulty_batch(table: str) -> Any:
    create_invoices, inject = invoice_service.invoice_batch_handler(table), faults()

    def batch_handler(conn: psycopg.Connection[Any], events: list[Event]) -> None:
        create_invoices(conn, events)
        for event in events:
            inject(conn, event)

    return batch_handler


def main(argv: list[str]) -> int:
    table = argv[argv.index("--invoices-table") + 1] if "--invoices-table" in argv else "invoices"
    if os.environ.get("INVOICE_NO_GUARD") == "1":
        real = cdc.consumer.records.mark_processed

        def no_guard(conn: psycopg.Connection[Any], *args: Any) -> bool:
            real(conn, *args)
            return True

        cdc.consumer.records.mark_processed = no_guard  # type: ignore[assignment]
        # Every record on the per-record path, whose guard is the one replaced above (a batch also skips
        # an id it has seen in the same batch, which would hide the missing guard).
        cdc.consumer.batches.Batches._apply_batch = lambda self, records: (0, None)  # type: ignore[method-assign]
    if os.environ.get("FAULT_OWN_IDS") == "1":
        read = cdc.consumer.EventDeserializer.__call__

        def own_ids(self: cdc.consumer.EventDeserializer, message: Any) -> Event:
            event = read(self, message)
            return dataclasses.replace(event, id=f"own-{event.id}")

        cdc.consumer.EventDeserializer.__call__ = own_ids  # type: ignore[method-assign]
    return invoice_service.main(argv, handler=faulty(table), batch_handler=faulty_batch(table))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

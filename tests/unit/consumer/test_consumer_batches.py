"""The consumer's batch path (cdc.consumer.batches.Batches) at its interface, with fakes: Kafka records, the
service's connection over an in-memory guard table, handlers, and the callables it is given (the per-record
path, counting, done). How a batch is committed, where it ends when a handler fails, how a batch handler's
failure is halved down to its event, and how the next batch is sized (tests/integration/consumer runs it for
real, with PostgreSQL's pipeline mode)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cdc.avro.deserialize import Event
from cdc.config import TableRef
from cdc.consumer import PermanentError
from cdc.consumer import batches as batches_module
from cdc.consumer.batches import BATCH_SECONDS, Batches
from tests.unit.consumer.fakes import FakeConnection, decode, records


class Path:
    """A Batches part and what it was given: ``conn``; ``one_by_one`` (record, event id, error) handed to
    the per-record path; ``done`` the offsets reported done, one list per call; ``counted`` (id, new).
    ``refuse`` are the ids the handler raises PermanentError for (after writing its effect); with
    ``batch=True`` a batch handler writes each new event's effect, and ``sizes`` are its calls' lengths."""

    def __init__(
        self,
        *,
        refuse: tuple[str, ...] = (),
        batch: bool = False,
        pipeline: bool = True,
        size: int = 1000,
        handler: Any = None,
    ) -> None:
        self.conn = FakeConnection()
        self.refuse = set(refuse)
        self.one_by_one: list[tuple[int, str | None, BaseException | None]] = []
        self.done: list[list[int]] = []
        self.counted: list[tuple[str, bool]] = []
        self.sizes: list[int] = []
        self.stop = threading.Event()
        self.batches = Batches(
            self.conn,  # type: ignore[arg-type]
            handler=handler or self.handler,
            batch_handler=self.batch_handler if batch else None,
            deserializer=decode,
            table=TableRef(schema="public", name="processed_events"),
            name="inv",
            batch_size=size,
            pipeline=pipeline,
            one_by_one=lambda r, event, error: self.one_by_one.append(
                (r.offset(), event.id if event else None, error)
            ),
            counted=lambda event, new: self.counted.append((event.id, new)),
            done=lambda *rs: self.done.append([r.offset() for r in rs]),
            stop=self.stop,
        )

    def handler(self, conn: Any, event: Event) -> None:
        conn.execute("effect", (event.id,))
        if event.id in self.refuse:
            raise PermanentError(f"refused {event.id}")

    def batch_handler(self, conn: Any, events: list[Event]) -> None:
        self.sizes.append(len(events))
        for event in events:
            self.handler(conn, event)


def test_a_batch_is_one_transaction_and_one_done_and_each_event_is_counted() -> None:
    path = Path()
    path.conn.guard.add("old")
    path.batches.process(records("a", "b", "old", "a", "c"))
    assert path.conn.commits == 1 and path.conn.effects == ["a", "b", "c"]
    assert path.done == [[0, 1, 2, 3, 4]]
    assert path.counted == [("a", True), ("b", True), ("old", False), ("a", False), ("c", True)]
    assert path.one_by_one == [] and path.conn.pipelines >= 1, "the handlers ran in pipeline mode"


def test_a_handler_that_raises_ends_its_batch_the_records_before_it_commit_and_the_rest_go_on() -> None:
    path = Path(refuse=("c",))
    path.batches.process(records("a", "b", "c", "d", "e"))
    assert path.done == [[0, 1], [3, 4]], "the prefix, then the rest as a batch again"
    assert path.conn.effects == ["a", "b", "d", "e"] and path.conn.rollbacks == 1
    ((offset, event_id, error),) = path.one_by_one
    assert (offset, event_id) == (2, "c") and isinstance(error, PermanentError), "with its first error"


def test_an_undecodable_record_ends_its_batch_and_takes_the_per_record_path_undecoded() -> None:
    path = Path()
    path.batches.process(records("a", "b", "garbage-1", "d"))
    assert path.done == [[0, 1], [3]]
    assert path.one_by_one == [(2, None, None)], "the per-record path decides: dead letter or registry"
    assert path.conn.guard == {"a", "b", "d"}, "the early guard rows of the undecodable batch rolled back"


def test_a_database_error_in_a_pipelined_batch_is_not_blamed_on_the_handler_it_surfaced_in() -> None:
    failed = []

    def handler(conn: Any, event: Event) -> None:
        conn.execute("effect", (event.id,))
        if event.id == "b" and not failed:  # once, as a serialization failure would
            failed.append(event.id)
            conn.execute("fail")

    path = Path(handler=handler)
    path.batches.process(records("a", "b", "c", "d"))
    assert path.one_by_one == [], "c, in whose handler the error surfaced, is not blamed"
    assert path.conn.effects == ["a", "b", "c", "d"] and path.done == [[0, 1, 2, 3]]
    assert path.conn.pipelines >= 2 and path.conn.rollbacks == 1, "run again without the pipeline"


def test_a_batch_handler_that_raises_is_halved_until_its_event_is_alone() -> None:
    path = Path(refuse=("f",), batch=True)
    path.batches.process(records(*"abcdefgh"))
    assert path.conn.effects == list("abcdegh"), "every other event once, in order"
    assert path.done == [[0, 1, 2, 3], [4], [6, 7]]
    ((offset, event_id, error),) = path.one_by_one
    assert (offset, event_id) == (5, "f") and isinstance(error, PermanentError)
    assert path.sizes == [8, 4, 4, 2, 1, 3, 1, 2], "8, its first half; the rest: halved down to f"


def test_a_batch_handler_gets_each_new_event_once() -> None:
    path = Path(batch=True)
    path.conn.guard.add("old")
    path.batches.process(records("a", "old", "a", "b"))
    assert path.sizes == [2] and path.conn.effects == ["a", "b"]
    assert path.counted == [("a", True), ("old", False), ("a", False), ("b", True)]


def test_the_next_batch_is_sized_to_take_batch_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    took = 10 * BATCH_SECONDS / 64  # 10 records, each in 1/64 of BATCH_SECONDS (exact in binary)
    clock = iter([100.0, 100.0 + took, 200.0, 200.0 + took])
    monkeypatch.setattr(batches_module.time, "monotonic", lambda: next(clock))
    path = Path(size=40)
    assert path.batches.next_size() == 1, "nothing timed yet: one record"
    path.batches.process(records(*"abcdefghij"))
    assert path.batches.next_size() == 40, "64 records would take BATCH_SECONDS: capped at batch_size"
    path = Path()
    path.batches.process(records(*"abcdefghij"))
    assert path.batches.next_size() == 64


def test_a_stop_ends_the_batch_path_before_the_next_batch() -> None:
    path = Path()
    path.stop.set()
    path.batches.process(records("a", "b"))
    assert path.done == [] and path.conn.commits == 0

"""The pure parts of `cdc dlq`: record ids, header splitting, folding markers over records, and where the
consumer group's bookmark may move after a replay."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from cdc.cli import main
from cdc.config_loader import load_settings
from cdc.errors import AccessDeniedError, DeadLetterError
from cdc.ops.dlq import (
    DeadLetter,
    DeadLetterTopic,
    Scan,
    parse_id,
    refused_writes,
    resume_offset,
    split_headers,
)

UUID = "0b7c2a1e-3f7e-4d2a-9a55-2f0b8e7f6c11"


def letter(partition: int, offset: int, event_id: str = "", ts: int = 1_700_000_000_000, **headers: str):
    pairs = [("error_reason", b"schema_not_found"), ("id", event_id.encode())]
    pairs += [(k, v.encode()) for k, v in headers.items()]
    return DeadLetter(partition, offset, b"key", b"{}", ts, tuple(pairs))


def marker(partition: int, offset: int, target: str):
    return DeadLetter(partition, offset, None, None, 0, (("cdc_dlq_resolved", target.encode()), ("id", b"x")))


def scan_of(records, ranges=None):
    return Scan.of("dlq", ranges or {}, records)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0:5", (0, 5)),
        (" 12:0 ", (12, 0)),
        (UUID, UUID),
        ("order-42", "order-42"),
        ("a:1", "a:1"),
        ("-1:2", "-1:2"),
        ("1:2:3", "1:2:3"),
        ("1:", "1:"),
    ],
)
def test_parse_id(text, expected):
    assert parse_id(text) == expected


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_id_refuses_an_empty_id(text):
    with pytest.raises(DeadLetterError, match="empty dead-letter record id"):
        parse_id(text)


PIPELINE_HEADERS = [
    ("error_class", b"SchemaNotFoundError"),
    ("error_reason", b"schema_not_found"),
    ("error_message", b"no schema"),
    ("original_topic", b"outbox.event.invoice"),
    ("commit_lsn", b"0/16B3748"),
    ("xid", b"771"),
    ("id", UUID.encode()),
    ("event_type", b"InvoiceIssued"),
    ("schema_version", b"1"),
    ("aggregate_type", b"invoice"),
    ("traceparent", b"00-abc-def-01"),
]


@pytest.mark.parametrize(
    ("headers", "original", "errors"),
    [
        (
            PIPELINE_HEADERS,
            PIPELINE_HEADERS[4:],
            {
                "error_class": b"SchemaNotFoundError",
                "error_reason": b"schema_not_found",
                "error_message": b"no schema",
                "original_topic": b"outbox.event.invoice",
            },
        ),
        # A row header that shares an error header's name comes later: it is the row's own and is kept.
        (
            [("error_reason", b"too_large"), ("id", b"e1"), ("error_reason", b"mine")],
            [("id", b"e1"), ("error_reason", b"mine")],
            {"error_reason": b"too_large"},
        ),
        # A malformed change's record: the error headers and the empty id.
        (
            [("error_reason", b"malformed_event"), ("id", b"")],
            [("id", b"")],
            {"error_reason": b"malformed_event"},
        ),
        ([], [], {}),
    ],
)
def test_split_headers(headers, original, errors):
    assert split_headers(headers) == (original, errors)


@pytest.mark.parametrize(
    ("start", "end", "unresolved", "markers", "expected"),
    [
        (0, 0, [], [], 0),  # empty partition: stays
        (0, 5, [], [], 5),  # everything read is resolved or a marker: past it
        (0, 5, [3, 1], [], 1),  # the first unresolved record
        (2, 5, [2], [5, 6], 2),  # the very first offset still unresolved: no move
        (0, 5, [], [5, 6], 7),  # our markers right after the scan: past them too
        (0, 5, [], [6, 7], 5),  # a gap at 5 may hold a new dead letter nobody has seen
        (0, 5, [4], [5, 6], 4),
        (3, 5, [1], [], 5),  # an offset below the range does not pull the bookmark back
    ],
)
def test_resume_offset(start, end, unresolved, markers, expected):
    assert resume_offset(start, end, unresolved, markers) == expected


def test_markers_resolve_records_and_are_never_listed():
    scan = scan_of(
        [letter(1, 0), marker(0, 2, "0:0"), letter(0, 1, "b"), letter(0, 0, "a"), marker(1, 1, "junk")]
    )
    assert [r.id for r in scan.listing()] == ["b", "1:0"]
    assert [r.position for r in scan.records] == [(0, 0), (0, 1), (1, 0)], "markers are no dead letters"
    assert scan.resolved == {(0, 0)}


@pytest.mark.parametrize(
    ("records", "listed"),
    [
        # Dead-lettered twice (a replay after a crash): listed once, as the latest copy.
        ([letter(0, 0, "a"), letter(0, 3, "a"), letter(0, 4, "b")], [(0, 3), (0, 4)]),
        ([letter(0, 0, "a", ts=5), letter(2, 0, "a", ts=9)], [(2, 0)]),
        # Only the latest copy resolved: the older one is listed still.
        ([letter(0, 0, "a"), letter(0, 3, "a"), marker(0, 5, "0:3")], [(0, 0)]),
        # Records without an event id are each their own.
        ([letter(0, 0), letter(0, 1)], [(0, 0), (0, 1)]),
    ],
)
def test_listing_keeps_the_latest_copy_of_each_event(records, listed):
    assert [r.position for r in scan_of(records).listing()] == listed


@pytest.mark.parametrize(
    ("text", "found"),
    [("a", (0, 3)), ("0:3", (0, 3)), ("0:0", (0, 3)), ("b", (1, 2)), (" 1:2 ", (1, 2)), ("1:4", (1, 4))],
)
def test_find_by_event_id_or_position(text, found):
    scan = scan_of([letter(0, 0, "a"), letter(0, 3, "a"), letter(1, 2, "b"), letter(1, 4)])
    assert scan.find(text).position == found


@pytest.mark.parametrize("text", ["nope", "7:7", "0:1", "c", "0:9"])
def test_find_refuses_unknown_and_resolved_ids(text):
    scan = scan_of([letter(0, 0, "a"), letter(0, 1, "c"), marker(0, 9, "0:1")])
    with pytest.raises(DeadLetterError, match=r"no unresolved dead-letter record with id .*`cdc dlq list`"):
        scan.find(text)


def test_copies_are_every_unresolved_record_of_the_event():
    scan = scan_of(
        [letter(0, 0, "a"), letter(0, 3, "a"), letter(0, 4, "b"), letter(1, 1, "a"), marker(1, 2, "1:1")]
    )
    assert [r.position for r in scan.copies(scan.find("a"))] == [(0, 0), (0, 3)]


@pytest.mark.parametrize(
    ("records", "ranges", "replayed", "markers", "expected"),
    [
        # Partition 0 settled by an old marker; partition 1: 2 replayed now, 3 unresolved still.
        (
            [letter(0, 0, "a"), marker(0, 1, "0:0"), letter(1, 2, "r"), letter(1, 3, "s")],
            {0: (0, 2), 1: (2, 4)},
            {(1, 2)},
            {1: [4]},
            {0: 2, 1: 3},
        ),
        ([letter(0, 5, "a")], {0: (5, 6)}, set(), {}, {}),  # its first record unresolved: no commit
        ([letter(0, 5, "a")], {0: (5, 6)}, {(0, 5)}, {0: [6, 7]}, {0: 8}),  # past our own markers
        ([letter(0, 5, "a")], {0: (5, 6)}, {(0, 5)}, {0: [7]}, {0: 6}),  # not past a gap
        ([], {0: (0, 0), 1: (4, 4)}, set(), {}, {}),
        ([marker(2, 7, "2:1")], {2: (7, 8)}, set(), {}, {2: 8}),
    ],
)
def test_resume_offsets_per_partition(records, ranges, replayed, markers, expected):
    scan = scan_of(records, ranges)
    scan.resolved |= replayed
    assert scan.resume_offsets(markers) == expected


def test_summary_names_the_record_and_its_time_in_utc():
    record = letter(2, 7, UUID, ts=1_700_000_000_123, event_type="InvoiceIssued", schema_version="1")
    assert record.summary() == {
        "id": UUID,
        "event_type": "InvoiceIssued",
        "schema_version": "1",
        "reason": "schema_not_found",
        "time": "2023-11-14T22:13:20.123Z",
        "position": "2:7",
    }
    assert "payload" not in record.details()
    assert record.details(payload=True)["payload"] == {}


@pytest.mark.parametrize("args", [["dlq", "replay"], ["dlq", "replay", "--all", "0:1"]])
def test_replay_needs_ids_or_all_but_not_both(args):
    result = CliRunner().invoke(main, args, env={"CDC_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.exit_code == 2, result.output
    assert "--all" in result.output


def because(partition: int, offset: int, event_id: str, reason: str) -> DeadLetter:
    pairs = (("error_reason", reason.encode()), ("id", event_id.encode()))
    return DeadLetter(partition, offset, b"key", b"{}", 1_700_000_000_000, pairs)


def test_unresolved_records_are_counted_per_reason_and_a_resolved_one_says_how():
    discarded = DeadLetter(
        0,
        9,
        None,
        None,
        1_700_000_001_000,
        (
            ("cdc_dlq_resolved", b"0:2"),
            ("id", b"b"),
            ("discarded_by", b"alice"),
            ("discard_reason", b"test row"),
        ),
    )
    replayed = DeadLetter(
        1, 9, None, None, 0, (("cdc_dlq_resolved", b"1:1"), ("id", b"c"), ("replayed_to", b"outbox.order"))
    )
    scan = scan_of(
        [
            because(0, 1, "a", "payload_invalid"),
            letter(0, 2, "b"),
            letter(1, 1, "c"),
            letter(1, 2, "d"),
            letter(1, 3, "d"),  # a copy: one listed record
            because(1, 4, "e", "payload_invalid"),
            because(1, 5, "f", "too_large"),
            discarded,
            replayed,
        ]
    )
    assert scan.by_reason() == {"payload_invalid": 2, "schema_not_found": 1, "too_large": 1}
    with pytest.raises(DeadLetterError, match="no unresolved dead-letter record with id b"):
        scan.find("b")
    gone = scan.details(scan.find_any("b"))["resolution"]
    assert gone == {
        "outcome": "discarded",
        "by": "alice",
        "reason": "test row",
        "time": "2023-11-14T22:13:21.000Z",
        "marker": "0:9",
    }
    assert scan.details(scan.find_any("1:1"))["resolution"]["outcome"] == "replayed"
    assert scan.details(scan.find_any("1:1"))["resolution"]["to"] == "outbox.order"
    assert scan.details(scan.find_any("a"))["resolution"] is None
    with pytest.raises(DeadLetterError):
        scan.find_any("zz")


# -- a right the tools lack: the grant, not "is the broker up?" ------------------------------------------


def dlq_settings(**overrides):
    environ = {"CDC_DATABASE_URL": "postgresql://u@h/db", "CDC_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    return load_settings(config_file=None, environ=environ, overrides=overrides)


@pytest.mark.parametrize(
    ("code", "right", "grant"),
    [
        (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            "Read on Topic:outbox.dlq",
            "--operation Read --topic outbox.dlq",
        ),
        (
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            "Read on Group:cdc-dlq-outbox.dlq",
            "--operation Read --group cdc-dlq-outbox.dlq",
        ),
    ],
)
def test_a_denied_read_of_the_dead_letter_topic_names_the_grant(code, right, grant):
    with DeadLetterTopic(dlq_settings()) as topic:
        refusal = topic._fail(KafkaException(KafkaError(code)), waited=5)
    assert isinstance(refusal, AccessDeniedError) and refusal.right == right and refusal.exit_code == 2
    assert grant in refusal.message and "broker is up" not in refusal.message
    assert "prefixed" not in refusal.message  # the group is named in full


def test_any_other_failure_to_read_it_is_still_about_reaching_the_broker():
    with DeadLetterTopic(dlq_settings()) as topic:
        failure = topic._fail(KafkaException(KafkaError(KafkaError._TIMED_OUT)), waited=5)
    assert type(failure) is DeadLetterError and "waited 5 s" in failure.message
    assert "broker is up" in failure.message


def test_a_denied_write_of_a_marker_or_a_replay_names_the_grant_and_others_do_not():
    settings = dlq_settings(kafka={"sasl.username": "ops"})
    with pytest.raises(AccessDeniedError) as denied:
        refused_writes(settings, [None, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)], "outbox.dlq")
    assert denied.value.right == "Write on Topic:outbox.dlq"
    assert "--allow-principal User:ops --operation Write --topic outbox.dlq" in denied.value.message
    refused_writes(settings, [None, KafkaError(KafkaError._MSG_TIMED_OUT)], "outbox.dlq")  # not a denial


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("2026-12-07T04:00:00.123+00:00", 1796616000123),  # as the pipeline writes it
        ("2026-12-07T05:00:00.001+01:00", 1796616000001),
        ("2026-12-07T04:00:00.000+00:00", 1796616000000),
        (None, 5),  # a dead letter without one keeps its own timestamp
        ("yesterday", 5),
        ("2026-12-07T04:00:00", 5),  # no zone: not the pipeline's
    ],
)
def test_a_replay_is_stamped_with_the_dead_letters_commit_time(header: str | None, expected: int) -> None:
    from cdc.ops.replay import commit_ms

    pairs = (("id", b"e-1"),) + ((("commit_time", header.encode()),) if header is not None else ())
    assert commit_ms(DeadLetter(0, 0, None, b"{}", 5, pairs)) == expected

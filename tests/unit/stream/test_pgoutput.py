"""Unit tests of cdc.stream.pgoutput against traffic captured from a real PostgreSQL 15 (tests/data/pgoutput)
and hand-built messages for what PostgreSQL 15 cannot send (protocol v4)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cdc.errors import ProtocolError, parse_lsn
from cdc.stream.pgoutput import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Column,
    Commit,
    Delete,
    Insert,
    Keepalive,
    LogicalMessage,
    Origin,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TypeMessage,
    Update,
    XLogData,
    decode,
    decode_copy_data,
    decode_insert_tuple,
    standby_status_update,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "pgoutput"
INDEX: dict[str, Any] = json.loads((DATA / "index.json").read_text())
CAPTURES = ["v1", "v1_binary", "v2", "v3"]
STREAMING = ["v2", "v3"]

WORKLOAD = {step["label"]: step for step in INDEX["workload"]}
WORKLOAD_GID = {step["xid"]: step["gid"] for step in INDEX["workload"] if "gid" in step}
OID = {name: rel["oid"] for name, rel in INDEX["relations"].items()}
MOOD_OID = INDEX["types"]["public.mood"]
LSN_BEFORE = parse_lsn(INDEX["wal_lsn_before_workload"])
LSN_AFTER = parse_lsn(INDEX["wal_lsn_after_workload"])

KIND = {
    Begin: "B",
    Commit: "C",
    Origin: "O",
    Relation: "R",
    TypeMessage: "Y",
    Insert: "I",
    Update: "U",
    Delete: "D",
    Truncate: "T",
    LogicalMessage: "M",
    StreamStart: "S",
    StreamStop: "E",
    StreamCommit: "c",
    StreamAbort: "A",
}

RELATIONS = {
    "outbox": Relation(
        OID["outbox"],
        "public",
        "outbox",
        "d",
        (
            Column("id", 2950, -1, True),
            Column("aggregate_type", 25, -1, False),
            Column("aggregate_id", 25, -1, False),
            Column("event_type", 25, -1, False),
            Column("schema_version", 23, -1, False),
            Column("payload", 3802, -1, False),
            Column("headers", 3802, -1, False),
            Column("created_at", 1184, -1, False),
        ),
    ),
    "accounts": Relation(
        OID["accounts"],
        "public",
        "accounts",
        "f",
        (
            Column("id", 23, -1, True),
            Column("owner", 1043, 24, True),  # varchar(20): typmod 20 + 4; FULL identity flags every column
            Column("balance", 20, -1, True),
            Column("mood", MOOD_OID, -1, True),
        ),
    ),
    "docs": Relation(
        OID["docs"],
        "public",
        "docs",
        "d",
        (
            Column("id", 23, -1, True),
            Column("title", 25, -1, False),
            Column("body", 25, -1, False),
        ),
    ),
    # published with a column list (id): pad is not sent
    "bulk": Relation(OID["bulk"], "public", "bulk", "d", (Column("id", 23, -1, True),)),
}
RELATION_BY_OID = {rel.oid: rel for rel in RELATIONS.values()}


def outbox_text(n: int, headers: bytes | None = None) -> tuple[Any, ...]:
    return (
        f"00000000-0000-4000-8000-{n:012d}".encode(),
        b"order",
        f"order-{n}".encode(),
        b"OrderPlaced",
        b"1",
        b'{"items": ["a", "b"], "total": %d}' % (n * 10),
        headers,
        b"2024-05-01 12:00:0%d+00" % n,
    )


def outbox_binary(n: int) -> tuple[Any, ...]:
    created = (1714564800 + n - 946684800) * 1_000_000  # 2024-05-01 12:00:0n UTC, µs since 2000-01-01
    return (
        uuid.UUID(f"00000000-0000-4000-8000-{n:012d}").bytes,
        b"order",
        f"order-{n}".encode(),
        b"OrderPlaced",
        struct.pack(">i", 1),
        b'\x01{"items": ["a", "b"], "total": %d}' % (n * 10),  # jsonb binary format version 1
        None,
        struct.pack(">q", created),
    )


def records(name: str) -> list[bytes]:
    blob = (DATA / f"{name}.bin").read_bytes()
    out, pos = [], 0
    while pos < len(blob):
        (length,) = struct.unpack_from(">I", blob, pos)
        out.append(blob[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return out


@dataclass
class Txn:
    xid: int
    begin: Begin | None = None
    origin: Origin | None = None
    end: Commit | StreamCommit | StreamAbort | None = None
    segments: list[StreamStart] = field(default_factory=list)
    sub_aborts: list[StreamAbort] = field(default_factory=list)
    changes: list[PgOutputMessage] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    @property
    def data(self) -> list[PgOutputMessage]:
        return [m for m in self.changes if not isinstance(m, Relation | TypeMessage)]


@dataclass
class Decoded:
    envelopes: list[XLogData | Keepalive]
    messages: list[PgOutputMessage | ProtocolError | None]  # None for keepalives
    txns: list[Txn]  # in commit / abort order
    non_transactional: list[LogicalMessage]

    def txn(self, label: str) -> Txn:
        found = [t for t in self.txns if t.xid == WORKLOAD[label]["xid"]]
        assert len(found) == 1, f"{label}: {len(found)} transactions"
        return found[0]

    def has(self, label: str) -> bool:
        return any(t.xid == WORKLOAD[label]["xid"] for t in self.txns)


@cache
def decoded(name: str) -> Decoded:
    """Decode a capture and group it into transactions, the way a consumer of the stream would."""
    result = Decoded([], [], [], [])
    in_stream = False
    current: Txn | None = None
    streamed: dict[int, Txn] = {}
    two_phase: Txn | None = None
    for raw in records(name):
        envelope = decode_copy_data(raw)
        result.envelopes.append(envelope)
        if isinstance(envelope, Keepalive):
            result.messages.append(None)
            continue
        try:
            msg = decode(envelope.payload, in_stream=in_stream)
        except ProtocolError as exc:  # two-phase messages (v3 capture only), followed by hand-parsing
            result.messages.append(exc)
            kind = chr(envelope.payload[0])
            assert kind in "bPKr", exc
            if kind == "b":  # Begin Prepare: 'b', prepare LSN, end LSN, prepare time, xid, gid
                assert two_phase is None and current is None
                two_phase = current = Txn(xid=struct.unpack_from(">I", envelope.payload, 25)[0])
            assert two_phase is not None
            two_phase.rejected.append(kind)
            if kind == "P":
                current = None
            elif kind in "Kr":  # Commit / Rollback Prepared: 'K'/'r', flags, 2 LSNs, 1/2 times, xid, gid
                xid_at = 26 if kind == "K" else 34
                assert struct.unpack_from(">I", envelope.payload, xid_at)[0] == two_phase.xid
                assert envelope.payload.endswith(WORKLOAD_GID[two_phase.xid].encode() + b"\x00")
                result.txns.append(two_phase)
                two_phase = None
            continue
        result.messages.append(msg)
        match msg:
            case Begin():
                assert current is None and not in_stream
                current = Txn(xid=msg.xid, begin=msg)
            case Commit():
                assert current is not None and current.begin is not None
                current.end = msg
                result.txns.append(current)
                current = None
            case Origin():
                assert current is not None and current.changes == []
                current.origin = msg
            case StreamStart():
                in_stream = True
                current = streamed.setdefault(msg.xid, Txn(xid=msg.xid))
                current.segments.append(msg)
            case StreamStop():
                in_stream = False
                current = None
            case StreamCommit():
                txn = streamed.pop(msg.xid)
                txn.end = msg
                result.txns.append(txn)
            case StreamAbort() if msg.xid == msg.subxid:
                txn = streamed.pop(msg.xid)
                txn.end = msg
                result.txns.append(txn)
            case StreamAbort():
                streamed[msg.xid].sub_aborts.append(msg)
            case LogicalMessage(transactional=False):
                assert current is None
                result.non_transactional.append(msg)
            case _:
                assert current is not None, msg
                current.changes.append(msg)
    assert current is None and not streamed and two_phase is None
    return result


# --- the captured streams, message by message ---------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_every_message_matches_the_index(name: str) -> None:
    capture = INDEX["captures"][name]
    d = decoded(name)
    assert len(d.envelopes) == len(capture["messages"]) > 100
    for envelope, msg, entry in zip(d.envelopes, d.messages, capture["messages"], strict=True):
        if entry["envelope"] == "k":
            assert isinstance(envelope, Keepalive)
            assert envelope.reply_requested is entry["reply_requested"]
        else:
            assert isinstance(envelope, XLogData)
            assert len(envelope.payload) == entry["length"] - 25
            if isinstance(msg, ProtocolError):
                assert name == "v3" and entry["kind"] in "bPKr"
            else:
                assert KIND[type(msg)] == entry["kind"]
                assert (getattr(msg, "xid", None) is not None) == (
                    entry["in_stream"] and entry["kind"] in "RYIUDTM" or entry["kind"] in "BSAc"
                )
        assert capture["started_us"] - 1_000_000 < envelope.send_time_us < capture["finished_us"] + 1_000_000


@pytest.mark.parametrize("name", CAPTURES)
def test_envelopes_positions(name: str) -> None:
    for envelope in decoded(name).envelopes:
        if isinstance(envelope, XLogData) and envelope.wal_start:  # Relation/Type messages carry 0
            assert LSN_BEFORE <= envelope.wal_start <= envelope.wal_end


@pytest.mark.parametrize("name", CAPTURES)
def test_transactions_begin_and_commit_agree(name: str) -> None:
    d = decoded(name)
    commit_lsns = []
    for txn in d.txns:
        if txn.begin is not None:
            assert isinstance(txn.end, Commit)
            assert txn.begin.xid == txn.xid
            assert txn.begin.final_lsn == txn.end.commit_lsn
            assert txn.begin.commit_time_us == txn.end.commit_time_us
            assert txn.end.flags == 0
        if isinstance(txn.end, Commit | StreamCommit):
            assert LSN_BEFORE < txn.end.commit_lsn < txn.end.end_lsn <= LSN_AFTER
            commit_lsns.append(txn.end.commit_lsn)
            if txn.origin is None:
                assert INDEX["workload_started_us"] <= txn.end.commit_time_us <= INDEX["workload_finished_us"]
    assert commit_lsns == sorted(commit_lsns) and len(set(commit_lsns)) == len(commit_lsns)
    # every workload transaction's xid, in workload order (rolled-back ones only where they are streamed)
    xids = [t.xid for t in d.txns]
    expected = [s["xid"] for s in INDEX["workload"] if "xid" in s]
    missing = {"two_phase_rollback", "bulk_streamed_abort"} if name.startswith("v1") else set()
    if name == "v2":
        missing = {"two_phase_rollback"}
    assert xids == [x for x in expected if x not in {WORKLOAD[m]["xid"] for m in missing}]


@pytest.mark.parametrize("name", CAPTURES)
def test_relations_and_types(name: str) -> None:
    d = decoded(name)
    seen: set[int] = set()
    types = []
    for msg in d.messages:
        if isinstance(msg, Relation):
            assert dataclasses.replace(msg, xid=None) == RELATION_BY_OID[msg.oid]
            seen.add(msg.oid)
        elif isinstance(msg, TypeMessage):
            types.append(msg)
        elif isinstance(msg, Insert | Update | Delete):
            assert msg.relation_oid in seen, "a change before its Relation message"
        elif isinstance(msg, Truncate):
            assert set(msg.relation_oids) <= seen
    assert seen == set(OID.values())
    assert {dataclasses.replace(t, xid=None) for t in types} == {TypeMessage(MOOD_OID, "public", "mood")}


@pytest.mark.parametrize("name", ["v1", "v2", "v3"])
def test_text_values(name: str) -> None:
    d = decoded(name)
    outbox, accounts, docs = OID["outbox"], OID["accounts"], OID["docs"]
    assert d.txn("outbox_insert").data == [Insert(outbox, outbox_text(1))]

    txn = d.txn("outbox_with_message")
    assert isinstance(txn.end, Commit)
    assert txn.data == [
        Insert(outbox, outbox_text(2, b'{"traceparent": "00-abc-def-01"}')),
        # a message's LSN is the end of its WAL record: here the start of the commit record
        LogicalMessage(True, txn.end.commit_lsn, "outbox", b'{"id": 2, "note": "transactional"}'),
    ]
    assert [dataclasses.replace(m, lsn=0) for m in d.non_transactional] == [
        LogicalMessage(False, 0, "heartbeat", b"\x00\x01\x02ping"),
        LogicalMessage(False, 0, "capture-end", b"done"),
    ]
    heartbeat, end = d.non_transactional
    assert d.txn("outbox_with_message").end.commit_lsn < heartbeat.lsn  # type: ignore[union-attr]
    assert heartbeat.lsn < d.txn("accounts_insert").end.commit_lsn < end.lsn <= LSN_AFTER  # type: ignore[union-attr]

    assert d.txn("accounts_insert").changes == [
        TypeMessage(MOOD_OID, "public", "mood"),
        RELATIONS["accounts"],
        Insert(accounts, (b"1", b"alice", b"100", b"happy")),
        Insert(accounts, (b"2", b"bob", None, b"sad")),
    ]
    assert d.txn("accounts_update_full").data == [
        Update(accounts, new=(b"1", b"alice", b"150", b"happy"), old=(b"1", b"alice", b"100", b"happy"))
    ]
    assert d.txn("accounts_delete_full").data == [Delete(accounts, old=(b"2", b"bob", None, b"sad"))]
    assert d.txn("docs_insert").data == [Insert(docs, (b"1", b"first", b"lorem ipsum " * 400))]
    assert d.txn("docs_update_unchanged_toast").data == [
        Update(docs, new=(b"1", b"renamed", UNCHANGED_TOAST))
    ]
    assert d.txn("docs_update_key").data == [
        Update(docs, new=(b"2", b"renamed", UNCHANGED_TOAST), key=(b"1", None, None))
    ]
    assert d.txn("docs_delete_key").data == [Delete(docs, key=(b"2", None, None))]

    txn = d.txn("origin_insert")
    assert txn.origin == Origin(0xABCDEF01, "upstream_node")
    assert txn.begin is not None and txn.begin.commit_time_us == 1_704_164_645_000_000  # 2024-01-02 03:04:05Z
    assert txn.data == [Insert(outbox, outbox_text(3))]

    assert d.txn("truncate_plain").data == [Truncate((OID["bulk"],), 0)]
    txn = d.txn("truncate_cascade_restart")
    assert txn.data == [Truncate((accounts, docs), 3)]
    assert txn.data[0].cascade and txn.data[0].restart_identity  # type: ignore[union-attr]
    assert not d.txn("truncate_plain").data[0].cascade  # type: ignore[union-attr]

    for msg in d.messages:  # text mode: plain bytes, never BinaryValue
        if isinstance(msg, Insert | Update):
            assert all(type(v) is bytes or v is None or v is UNCHANGED_TOAST for v in msg.new)


def test_two_phase_in_v1_and_v2_is_an_ordinary_transaction() -> None:
    for name in ["v1", "v2"]:
        d = decoded(name)
        assert d.txn("two_phase_commit").data == [Insert(OID["outbox"], outbox_text(4))]
        assert not d.has("two_phase_rollback")


def test_two_phase_messages_are_rejected_clearly() -> None:
    d = decoded("v3")
    assert d.txn("two_phase_commit").rejected == ["b", "P", "K"]
    assert d.txn("two_phase_commit").changes == [Insert(OID["outbox"], outbox_text(4))]
    assert d.txn("two_phase_rollback").rejected == ["b", "P", "r"]
    assert d.txn("two_phase_rollback").changes == [Insert(OID["outbox"], outbox_text(5))]
    errors = [str(m) for m in d.messages if isinstance(m, ProtocolError)]
    assert errors[:3] == [
        f"pgoutput two-phase message '{name}' ({kind!r}) is not supported: start replication without the"
        " two_phase option"
        for name, kind in [("Begin Prepare", "b"), ("Prepare", "P"), ("Commit Prepared", "K")]
    ]
    assert "'Rollback Prepared' ('r')" in errors[5]


def test_v1_bulk_transaction_is_not_streamed() -> None:
    d = decoded("v1")
    txn = d.txn("bulk_streamed_commit")
    assert txn.segments == [] and txn.changes[0] == RELATIONS["bulk"]
    assert txn.data == [Insert(OID["bulk"], (str(i).encode(),)) for i in [*range(1, 151), 2000]]


@pytest.mark.parametrize("name", STREAMING)
def test_streamed_transactions(name: str) -> None:
    d = decoded(name)
    step = WORKLOAD["bulk_streamed_commit"]
    xid, aborted_subxid, subxid = step["xid"], step["aborted_subxid"], step["subxid"]
    txn = d.txn("bulk_streamed_commit")
    assert txn.begin is None and isinstance(txn.end, StreamCommit)
    assert [s.first_segment for s in txn.segments] == [True] + [False] * (len(txn.segments) - 1)
    assert len(txn.segments) >= 3 and {s.xid for s in txn.segments} == {xid}
    assert txn.end.xid == xid and txn.end.flags == 0
    # streamed changes carry the xid of the (sub)transaction that made them
    bulk = OID["bulk"]
    # the savepoint's rows were streamed only as far as memory forced it before ROLLBACK TO SAVEPOINT
    streamed = len([m for m in txn.data if getattr(m, "xid", None) == aborted_subxid])
    assert 50 < streamed < 150
    assert txn.data == (
        [Insert(bulk, (str(i).encode(),), xid) for i in range(1, 151)]
        + [Insert(bulk, (str(i).encode(),), aborted_subxid) for i in range(1001, 1001 + streamed)]
        + [Insert(bulk, (b"2000",), subxid)]
    )
    assert txn.sub_aborts == [StreamAbort(xid, aborted_subxid)]
    for rel in txn.changes:
        if isinstance(rel, Relation):
            assert rel.xid in {xid, aborted_subxid, subxid}
            assert dataclasses.replace(rel, xid=None) == RELATIONS["bulk"]

    aborted = d.txn("bulk_streamed_abort")
    abort_xid = WORKLOAD["bulk_streamed_abort"]["xid"]
    assert aborted.end == StreamAbort(abort_xid, abort_xid)
    ids = [int(m.new[0]) for m in aborted.data]  # type: ignore[union-attr, arg-type]
    assert 0 < len(ids) < 150 and ids == list(range(3001, 3001 + len(ids)))  # only what was streamed
    assert {m.xid for m in aborted.changes} == {abort_xid}  # type: ignore[union-attr]


def test_binary_values() -> None:
    d = decoded("v1_binary")
    outbox, accounts = OID["outbox"], OID["accounts"]
    assert d.txn("outbox_insert").data == [Insert(outbox, outbox_binary(1))]
    assert d.txn("origin_insert").data == [Insert(outbox, outbox_binary(3))]
    assert d.txn("accounts_update_full").data == [
        Update(
            accounts,
            new=(struct.pack(">i", 1), b"alice", struct.pack(">q", 150), b"happy"),
            old=(struct.pack(">i", 1), b"alice", struct.pack(">q", 100), b"happy"),
        )
    ]
    assert d.txn("docs_update_unchanged_toast").data == [
        Update(OID["docs"], new=(struct.pack(">i", 1), b"renamed", UNCHANGED_TOAST))
    ]
    count = 0
    for msg in d.messages:
        if isinstance(msg, Insert | Update):
            for value in msg.new:
                assert value is None or value is UNCHANGED_TOAST or isinstance(value, BinaryValue)
                count += 1
    assert count > 150


@pytest.mark.parametrize("name", CAPTURES)
def test_insert_fast_path_agrees_with_decode(name: str) -> None:
    in_stream, checked = False, 0
    for envelope, msg in zip(decoded(name).envelopes, decoded(name).messages, strict=True):
        if isinstance(msg, StreamStart | StreamStop):
            in_stream = isinstance(msg, StreamStart)
        if isinstance(msg, Insert):
            assert isinstance(envelope, XLogData)
            assert decode_insert_tuple(envelope.payload, in_stream=in_stream) == (msg.relation_oid, msg.new)
            whole = b"w" + bytes(24) + envelope.payload  # the XLogData message as the pipeline reads it
            assert decode_insert_tuple(whole, in_stream=in_stream, offset=25) == (msg.relation_oid, msg.new)
            checked += 1
            if in_stream:  # the in_stream flag matters: without it the xid is read as the relation OID
                with pytest.raises(ProtocolError):
                    decode(envelope.payload)
    assert checked > 150


# --- keepalives and the standby status update ---------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_keepalives_and_the_status_update_the_server_accepted(name: str) -> None:
    capture = INDEX["captures"][name]
    sent = capture["status_update"]
    keepalives = [e for e in decoded(name).envelopes if isinstance(e, Keepalive)]
    assert isinstance(decoded(name).envelopes[0], Keepalive)
    ping, answer = keepalives[-2:]
    assert ping.reply_requested and not answer.reply_requested
    assert ping.wal_end == answer.wal_end == sent["lsn"] == sent["confirmed_flush_lsn"]
    assert ping.send_time_us <= answer.send_time_us
    built = standby_status_update(
        sent["lsn"], sent["lsn"], sent["lsn"], now_us=sent["client_time"] + PG_EPOCH_OFFSET_US, reply=True
    )
    assert built.hex() == sent["hex"]


def test_standby_status_update_round_trip() -> None:
    now_us = 1_700_000_000_123_456
    data = standby_status_update(0x16_B374D848, 0x16_B374D800, 0x15_00000000, now_us=now_us)
    assert len(data) == 34
    kind, written, flushed, applied, client_time, reply = struct.unpack(">cQQQqB", data)
    assert (kind, written, flushed, applied, reply) == (b"r", 0x16_B374D848, 0x16_B374D800, 0x15_00000000, 0)
    assert client_time == now_us - 946_684_800_000_000
    assert standby_status_update(1, 2, 3, now_us=PG_EPOCH_OFFSET_US, reply=True) == (
        b"r" + bytes(7) + b"\x01" + bytes(7) + b"\x02" + bytes(7) + b"\x03" + bytes(8) + b"\x01"
    )
    with pytest.raises(ValueError, match="out of range"):
        standby_status_update(-1, 0, 0, now_us=now_us)


def test_keepalive_and_xlogdata_hand_built() -> None:
    keepalive = b"k" + struct.pack(">QqB", 0x16_B374D848, 86_400_000_000, 1)
    assert decode_copy_data(keepalive) == Keepalive(0x16_B374D848, 946_771_200_000_000, True)
    assert decode_copy_data(keepalive[:-1] + b"\x00").reply_requested is False  # type: ignore[union-attr]
    xlog = b"w" + struct.pack(">QQq", 100, 200, -1) + b"E"
    assert decode_copy_data(xlog) == XLogData(100, 200, PG_EPOCH_OFFSET_US - 1, b"E")
    assert decode(decode_copy_data(xlog).payload) == StreamStop()  # type: ignore[union-attr]


# --- hand-built stream messages (v2) and v4's Stream Abort --------------------------------------------------


def text_tuple(*values: bytes | None) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        out += b"n" if v is None else b"t" + struct.pack(">I", len(v)) + v
    return out


XID = 0xDEADBEEF
STREAM_SAMPLES: list[tuple[bytes, PgOutputMessage]] = [
    (b"S" + struct.pack(">IB", XID, 1), StreamStart(XID, True)),
    (b"S" + struct.pack(">IB", XID, 0), StreamStart(XID, False)),
    (b"E", StreamStop()),
    (
        b"c" + struct.pack(">IBQQq", XID, 0, 0x1_0000_0010, 0x1_0000_0040, 5),
        StreamCommit(XID, 0, 0x1_0000_0010, 0x1_0000_0040, PG_EPOCH_OFFSET_US + 5),
    ),
    (b"A" + struct.pack(">II", XID, XID + 1), StreamAbort(XID, XID + 1)),
    # protocol v4 with streaming = parallel: abort LSN and abort time follow
    (
        b"A" + struct.pack(">IIQq", XID, XID, 0x2_0000_0000, -5),
        StreamAbort(XID, XID, 0x2_0000_0000, PG_EPOCH_OFFSET_US - 5),
    ),
]
IN_STREAM_SAMPLES: list[tuple[bytes, PgOutputMessage]] = [
    (
        b"R"
        + struct.pack(">I", XID)
        + struct.pack(">I", 16384)
        + b"s\x00t\x00i"
        + struct.pack(">H", 2)
        + b"\x01id\x00"
        + struct.pack(">Ii", 23, -1)
        + b"\x00v\x00"
        + struct.pack(">Ii", 1043, 36),
        Relation(16384, "s", "t", "i", (Column("id", 23, -1, True), Column("v", 1043, 36, False)), XID),
    ),
    (
        b"Y" + struct.pack(">II", XID, 90000) + b"public\x00mood\x00",
        TypeMessage(90000, "public", "mood", XID),
    ),
    (b"I" + struct.pack(">II", XID, 16384) + b"N" + text_tuple(b"1", None), Insert(16384, (b"1", None), XID)),
    (
        b"U" + struct.pack(">II", XID, 16384) + b"K" + text_tuple(b"1", None) + b"N" + text_tuple(b"2", b"x"),
        Update(16384, (b"2", b"x"), key=(b"1", None), xid=XID),
    ),
    (
        b"U" + struct.pack(">II", XID, 16384) + b"N" + struct.pack(">H", 2) + b"t\x00\x00\x00\x01\x32u",
        Update(16384, (b"2", UNCHANGED_TOAST), xid=XID),
    ),
    (
        b"D" + struct.pack(">II", XID, 16384) + b"O" + text_tuple(b"1", b""),
        Delete(16384, old=(b"1", b""), xid=XID),
    ),
    (
        b"T" + struct.pack(">IIB", XID, 2, 1) + struct.pack(">II", 16384, 16385),
        Truncate((16384, 16385), 1, XID),
    ),
    (
        b"M" + struct.pack(">IBQ", XID, 1, 0x30) + b"outbox\x00" + struct.pack(">I", 3) + b"a\x00b",
        LogicalMessage(True, 0x30, "outbox", b"a\x00b", XID),
    ),
]


@pytest.mark.parametrize(("data", "expected"), STREAM_SAMPLES + IN_STREAM_SAMPLES)
def test_hand_built_stream_messages(data: bytes, expected: PgOutputMessage) -> None:
    in_stream = getattr(expected, "xid", None) == XID and not isinstance(
        expected, StreamStart | StreamCommit | StreamAbort
    )
    assert decode(data, in_stream=in_stream) == expected


def test_a_v4_streamed_transaction_end_to_end() -> None:
    sequence = [
        b"S" + struct.pack(">IB", 700, 1),
        b"I" + struct.pack(">II", 701, 16384) + b"N" + text_tuple(b"42"),
        b"E",
        b"A" + struct.pack(">IIQq", 700, 701, 0x1234, 0),
        b"A" + struct.pack(">IIQq", 700, 700, 0x1300, 1_000_000),
    ]
    in_stream, out = False, []
    for data in sequence:
        msg = decode(data, in_stream=in_stream)
        in_stream = isinstance(msg, StreamStart) or (in_stream and not isinstance(msg, StreamStop))
        out.append(msg)
    assert out == [
        StreamStart(700, True),
        Insert(16384, (b"42",), 701),
        StreamStop(),
        StreamAbort(700, 701, 0x1234, PG_EPOCH_OFFSET_US),
        StreamAbort(700, 700, 0x1300, PG_EPOCH_OFFSET_US + 1_000_000),
    ]


# --- errors -------------------------------------------------------------------------------------------------


def first_payload_of_each_kind() -> dict[tuple[str, bool], bytes]:
    """One real payload per (message kind, in a stream): each kind of message with and without an xid."""
    found: dict[tuple[str, bool], bytes] = {}
    for name in CAPTURES:
        in_stream = False
        for envelope, msg in zip(decoded(name).envelopes, decoded(name).messages, strict=True):
            if isinstance(msg, StreamStart | StreamStop):
                in_stream = isinstance(msg, StreamStart)
            if isinstance(envelope, XLogData) and len(envelope.payload) < 600:
                found.setdefault((chr(envelope.payload[0]), in_stream), envelope.payload)
    return found


def test_every_truncation_of_a_real_message_is_a_protocol_error() -> None:
    samples = first_payload_of_each_kind()
    assert {kind for kind, _ in samples} == set("BCORYIUDTMSEcAbPKr")
    assert {kind for kind, in_stream in samples if in_stream} == set("RIS")  # S: the next segment's start
    checked = 0
    for (_kind, in_stream), payload in samples.items():
        for cut in range(len(payload)):
            with pytest.raises(ProtocolError):
                decode(payload[:cut], in_stream=in_stream)
            checked += 1
    for data, _ in STREAM_SAMPLES[:-1] + IN_STREAM_SAMPLES:
        for cut in range(len(data)):
            with pytest.raises(ProtocolError):
                decode(data[:cut], in_stream=data[:1] in b"RYIUDTM")
            checked += 1
    assert checked > 500


def test_truncated_messages_name_the_message() -> None:
    insert = b"I" + struct.pack(">I", 16384) + b"N" + text_tuple(b"hello")
    with pytest.raises(ProtocolError, match=r"truncated pgoutput Insert message \(16 bytes\)"):
        decode(insert[:-2])
    with pytest.raises(ProtocolError, match=r"truncated pgoutput Insert message \(17 bytes\)"):
        decode(insert[:-1])
    with pytest.raises(ProtocolError, match="truncated pgoutput Insert message"):
        decode_insert_tuple(insert[:-1])
    with pytest.raises(ProtocolError, match="truncated pgoutput Relation"):
        decode(IN_STREAM_SAMPLES[0][0][:-1], in_stream=True)
    with pytest.raises(ProtocolError, match="truncated pgoutput Message"):
        decode(b"M" + struct.pack(">BQ", 0, 1) + b"p\x00" + struct.pack(">I", 10) + b"short")
    with pytest.raises(ProtocolError, match="truncated pgoutput Truncate"):
        decode(b"T" + struct.pack(">IB", 0xFFFFFFFF, 0) + b"\x00\x00\x40\x00")
    with pytest.raises(ProtocolError, match="empty pgoutput message"):
        decode(b"")


def test_trailing_bytes_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="Begin message has 1 unexpected trailing bytes"):
        decode(b"B" + struct.pack(">QqI", 1, 2, 3) + b"\x00")
    with pytest.raises(ProtocolError, match="Stream Abort message has 4 unexpected trailing bytes"):
        decode(b"A" + struct.pack(">II", 1, 1) + bytes(4))
    with pytest.raises(ProtocolError, match="trailing"):
        decode_insert_tuple(b"I" + struct.pack(">I", 1) + b"N" + text_tuple(b"x") + b"t")


def test_unknown_message_types() -> None:
    with pytest.raises(ProtocolError, match=r"unknown pgoutput message type 'Z' \(0x5a, 3 bytes\)"):
        decode(b"Zab")
    with pytest.raises(ProtocolError, match="unknown pgoutput message type"):
        decode(b"\xff")
    with pytest.raises(ProtocolError, match="Insert: expected 'N' at byte 5"):
        decode(b"I" + struct.pack(">IH", 1, 1) + b"tx")
    with pytest.raises(ProtocolError, match="unknown tuple column kind 'x'"):
        decode(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"x")
    with pytest.raises(ProtocolError, match="Update: expected 'N'"):
        decode(b"U" + struct.pack(">I", 1) + b"X" + text_tuple(b"x"))
    with pytest.raises(ProtocolError, match="Delete: expected 'K' or 'O'"):
        decode(b"D" + struct.pack(">I", 1) + b"N" + text_tuple(b"x"))
    with pytest.raises(ProtocolError, match="not a pgoutput Insert message"):
        decode_insert_tuple(b"U" + struct.pack(">I", 1) + b"N" + text_tuple(b"x"))
    with pytest.raises(ProtocolError, match=r"unknown replication CopyData message type 'r' \(0x72\)"):
        decode_copy_data(standby_status_update(1, 1, 1, now_us=0))
    with pytest.raises(ProtocolError, match="empty replication CopyData message"):
        decode_copy_data(b"")


def test_truncated_envelopes() -> None:
    xlog = records("v1")[1]
    keepalive = records("v1")[0]
    assert xlog[:1] == b"w" and keepalive[:1] == b"k"
    for cut in range(1, 25):
        with pytest.raises(ProtocolError, match="truncated replication message 'w'"):
            decode_copy_data(xlog[:cut])
    for cut in range(1, 18):
        with pytest.raises(ProtocolError, match="keepalive"):
            decode_copy_data(keepalive[:cut])
    with pytest.raises(ProtocolError, match="keepalive message of 19 bytes"):
        decode_copy_data(keepalive + b"\x00")


def test_values_are_immutable_and_the_sentinel_is_a_singleton() -> None:
    msg = decode(IN_STREAM_SAMPLES[4][0], in_stream=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.xid = 1  # type: ignore[misc, union-attr]
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert msg.new[1] is UNCHANGED_TOAST  # type: ignore[union-attr]
    assert BinaryValue(b"ab") == b"ab" and isinstance(BinaryValue(b"ab"), bytes)

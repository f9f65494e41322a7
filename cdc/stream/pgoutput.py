"""Pure decoder of the pgoutput logical replication protocol and its replication-protocol envelope.

Bytes in (``bytes``, not memoryview: psycopg's ``get_copy_data`` gives a view, pass ``bytes(view)``),
frozen dataclasses out, no I/O. Two layers:

* the CopyData envelope of a replication connection: :func:`decode_copy_data` turns a server message into an
  :class:`XLogData` (``'w'``, carrying one pgoutput message as ``payload``) or a :class:`Keepalive` (``'k'``);
  :func:`standby_status_update` builds the client's ``'r'`` reply;
* the pgoutput messages themselves: :func:`decode` (protocol versions 1 to 4, see below) and
  :func:`decode_insert_tuple`, a fast path for the pipeline's hot message, the Insert.

The conventions of the dataclasses it makes (LSNs, times, tuple values, names, streams) are in
:mod:`cdc.stream.messages`. Anything truncated, trailing, or of an unknown type raises
:class:`~cdc.errors.ProtocolError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, TypeAlias

from cdc.errors import ProtocolError
from cdc.stream.messages import (
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
    TupleValue,
    TypeMessage,
    UnchangedToast,
    Update,
    Values,
    XLogData,
)

# The dataclasses it makes are re-exported: bytes in, these out.
__all__ = [
    "Begin",
    "BinaryValue",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Keepalive",
    "LogicalMessage",
    "Origin",
    "PG_EPOCH_OFFSET_US",
    "PgOutputMessage",
    "Relation",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleValue",
    "TypeMessage",
    "UNCHANGED_TOAST",
    "UnchangedToast",
    "Update",
    "Values",
    "XLogData",
    "decode",
    "decode_copy_data",
    "decode_insert_tuple",
    "standby_status_update",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">II")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_ORIGIN = struct.Struct(">Q")
_COLUMN_TYPE = struct.Struct(">Ii")
_RELATION_TAIL = struct.Struct(">BH")
_TRUNCATE = struct.Struct(">IB")
_MESSAGE = struct.Struct(">BQ")
_STREAM_START = struct.Struct(">IB")
_STREAM_COMMIT = struct.Struct(">IBQQq")
_STREAM_ABORT_V4 = struct.Struct(">IIQq")
_ENVELOPE = struct.Struct(">QQq")
_KEEPALIVE = struct.Struct(">QqB")
_STANDBY = struct.Struct(">cQQQqB")

_T, _N, _U, _B = b"tnub"
_OLD_KEY, _OLD_ROW, _NEW = b"KON"


class _Truncated(Exception):
    """Internal: a length field points past the end of the data."""


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(0, pos)  # ValueError when the terminator is missing
    return data[pos:end].decode("utf-8", "surrogateescape"), end + 1


def _tuple(
    data: bytes, pos: int, unpack_u32: Callable[[bytes, int], tuple[int]] = _U32.unpack_from
) -> tuple[Values, int]:
    """Parse TupleData at ``pos``; return the values and the position after them."""
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    size = len(data)
    values: list[TupleValue] = []
    append = values.append
    for _ in range(count):
        kind = data[pos]
        if kind == _T:
            # A length past the end is caught once, after the loop: the slice just comes out short.
            start = pos + 5
            pos = start + unpack_u32(data, pos + 1)[0]
            append(data[start:pos])
        elif kind == _N:
            append(None)
            pos += 1
        elif kind == _U:
            append(UNCHANGED_TOAST)
            pos += 1
        elif kind == _B:
            end = pos + 5 + unpack_u32(data, pos + 1)[0]
            if end > size:
                raise _Truncated
            append(BinaryValue(data[pos + 5 : end]))
            pos = end
        else:
            raise ProtocolError(f"unknown tuple column kind {chr(kind)!r} at byte {pos}")
    if pos > size:
        raise _Truncated
    return tuple(values), pos


def _begin(data: bytes, pos: int, xid: int | None) -> tuple[Begin, int]:
    final_lsn, time, txid = _BEGIN.unpack_from(data, pos)
    return Begin(final_lsn, time + PG_EPOCH_OFFSET_US, txid), pos + _BEGIN.size


def _commit(data: bytes, pos: int, xid: int | None) -> tuple[Commit, int]:
    flags, commit_lsn, end_lsn, time = _COMMIT.unpack_from(data, pos)
    return Commit(flags, commit_lsn, end_lsn, time + PG_EPOCH_OFFSET_US), pos + _COMMIT.size


def _origin(data: bytes, pos: int, xid: int | None) -> tuple[Origin, int]:
    (lsn,) = _ORIGIN.unpack_from(data, pos)
    name, pos = _cstring(data, pos + 8)
    return Origin(lsn, name), pos


def _relation(data: bytes, pos: int, xid: int | None) -> tuple[Relation, int]:
    (oid,) = _U32.unpack_from(data, pos)
    namespace, pos = _cstring(data, pos + 4)
    name, pos = _cstring(data, pos)
    identity, count = _RELATION_TAIL.unpack_from(data, pos)
    pos += 3
    columns = []
    for _ in range(count):
        flags = data[pos]
        column, pos = _cstring(data, pos + 1)
        type_oid, typmod = _COLUMN_TYPE.unpack_from(data, pos)
        pos += 8
        columns.append(Column(column, type_oid, typmod, bool(flags & 1)))
    return Relation(oid, namespace, name, chr(identity), tuple(columns), xid), pos


def _type(data: bytes, pos: int, xid: int | None) -> tuple[TypeMessage, int]:
    (oid,) = _U32.unpack_from(data, pos)
    namespace, pos = _cstring(data, pos + 4)
    name, pos = _cstring(data, pos)
    return TypeMessage(oid, namespace, name, xid), pos


def _not_new(data: bytes, pos: int, what: str) -> ProtocolError:
    return ProtocolError(f"{what}: expected 'N' at byte {pos}, got {chr(data[pos])!r}")


def _insert(data: bytes, pos: int, xid: int | None) -> tuple[Insert, int]:
    if data[pos + 4] != _NEW:
        raise _not_new(data, pos + 4, "Insert")
    new, end = _tuple(data, pos + 5)
    return Insert(_U32.unpack_from(data, pos)[0], new, xid), end


def _update(data: bytes, pos: int, xid: int | None) -> tuple[Update, int]:
    (oid,) = _U32.unpack_from(data, pos)
    pos += 4
    marker = data[pos]
    old = key = None
    if marker == _OLD_KEY:
        key, pos = _tuple(data, pos + 1)
    elif marker == _OLD_ROW:
        old, pos = _tuple(data, pos + 1)
    if data[pos] != _NEW:
        raise _not_new(data, pos, "Update")
    new, pos = _tuple(data, pos + 1)
    return Update(oid, new, old, key, xid), pos


def _delete(data: bytes, pos: int, xid: int | None) -> tuple[Delete, int]:
    (oid,) = _U32.unpack_from(data, pos)
    marker = data[pos + 4]
    if marker == _OLD_KEY:
        key, pos = _tuple(data, pos + 5)
        return Delete(oid, None, key, xid), pos
    if marker == _OLD_ROW:
        old, pos = _tuple(data, pos + 5)
        return Delete(oid, old, None, xid), pos
    raise ProtocolError(f"Delete: expected 'K' or 'O' at byte {pos + 4}, got {chr(marker)!r}")


def _truncate(data: bytes, pos: int, xid: int | None) -> tuple[Truncate, int]:
    count, options = _TRUNCATE.unpack_from(data, pos)
    pos += 5
    oids = struct.unpack_from(f">{count}I", data, pos)
    return Truncate(oids, options, xid), pos + 4 * count


def _message(data: bytes, pos: int, xid: int | None) -> tuple[LogicalMessage, int]:
    flags, lsn = _MESSAGE.unpack_from(data, pos)
    prefix, pos = _cstring(data, pos + 9)
    end = pos + 4 + _U32.unpack_from(data, pos)[0]
    if end > len(data):
        raise _Truncated
    return LogicalMessage(bool(flags & 1), lsn, prefix, data[pos + 4 : end], xid), end


def _stream_start(data: bytes, pos: int, xid: int | None) -> tuple[StreamStart, int]:
    txid, first = _STREAM_START.unpack_from(data, pos)
    return StreamStart(txid, first == 1), pos + 5


def _stream_stop(data: bytes, pos: int, xid: int | None) -> tuple[StreamStop, int]:
    return StreamStop(), pos


def _stream_commit(data: bytes, pos: int, xid: int | None) -> tuple[StreamCommit, int]:
    txid, flags, commit_lsn, end_lsn, time = _STREAM_COMMIT.unpack_from(data, pos)
    message = StreamCommit(txid, flags, commit_lsn, end_lsn, time + PG_EPOCH_OFFSET_US)
    return message, pos + _STREAM_COMMIT.size


def _stream_abort(data: bytes, pos: int, xid: int | None) -> tuple[StreamAbort, int]:
    if len(data) - pos >= _STREAM_ABORT_V4.size:  # v4, streaming = parallel
        txid, subxid, lsn, time = _STREAM_ABORT_V4.unpack_from(data, pos)
        return StreamAbort(txid, subxid, lsn, time + PG_EPOCH_OFFSET_US), pos + _STREAM_ABORT_V4.size
    txid, subxid = _U32_PAIR.unpack_from(data, pos)
    return StreamAbort(txid, subxid), pos + 8


_Parser: TypeAlias = Callable[[bytes, int, int | None], tuple[PgOutputMessage, int]]
_PARSERS: Final[dict[int, _Parser]] = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("O"): _origin,
    ord("R"): _relation,
    ord("Y"): _type,
    ord("I"): _insert,
    ord("U"): _update,
    ord("D"): _delete,
    ord("T"): _truncate,
    ord("M"): _message,
    ord("S"): _stream_start,
    ord("E"): _stream_stop,
    ord("c"): _stream_commit,
    ord("A"): _stream_abort,
}
_NAMES: Final = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
}
_TWO_PHASE: Final = {
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}
_WITH_XID_IN_STREAM: Final = frozenset(b"RYIUDTM")


def decode(data: bytes, *, in_stream: bool = False) -> PgOutputMessage:
    """Decode one pgoutput message (the payload of an :class:`XLogData`).

    ``in_stream`` must be true between Stream Start and Stream Stop: there the data messages carry an xid.
    """
    if not data:
        raise ProtocolError("empty pgoutput message")
    kind = data[0]
    parse = _PARSERS.get(kind)
    if parse is None:
        if kind in _TWO_PHASE:
            raise ProtocolError(
                f"pgoutput two-phase message {_TWO_PHASE[kind]!r} ({chr(kind)!r}) is not supported:"
                " start replication without the two_phase option"
            )
        raise ProtocolError(f"unknown pgoutput message type {chr(kind)!r} (0x{kind:02x}, {len(data)} bytes)")
    try:
        if in_stream and kind in _WITH_XID_IN_STREAM:
            message, end = parse(data, 5, _U32.unpack_from(data, 1)[0])
        else:
            message, end = parse(data, 1, None)
    except (IndexError, ValueError, struct.error, _Truncated) as exc:
        raise ProtocolError(f"truncated pgoutput {_NAMES[kind]} message ({len(data)} bytes)") from exc
    if end != len(data):
        name = _NAMES[kind]
        raise ProtocolError(f"pgoutput {name} message has {len(data) - end} unexpected trailing bytes")
    return message


def decode_insert_tuple(data: bytes, *, in_stream: bool = False, offset: int = 0) -> tuple[int, Values]:
    """Fast path for Insert: ``(relation_oid, new_values)`` without building an :class:`Insert`.

    ``offset`` is where the pgoutput message starts in ``data``: 25 for a whole XLogData message, which
    spares the hot path a copy of every row."""
    pos = offset + (5 if in_stream else 1)
    try:
        if data[offset] != 73 or data[pos + 4] != _NEW:  # 'I'
            raise ProtocolError(f"not a pgoutput Insert message: {data[offset : offset + 1]!r}")
        values, end = _tuple(data, pos + 5)
        oid: int = _U32.unpack_from(data, pos)[0]
    except (IndexError, struct.error, _Truncated) as exc:
        raise ProtocolError(f"truncated pgoutput Insert message ({len(data)} bytes)") from exc
    if end != len(data):
        raise ProtocolError(f"pgoutput Insert message has {len(data) - end} unexpected trailing bytes")
    return oid, values


def decode_copy_data(data: bytes) -> XLogData | Keepalive:
    """Decode one CopyData message of the replication stream: XLogData ('w') or primary keepalive ('k')."""
    if not data:
        raise ProtocolError("empty replication CopyData message")
    kind = data[0]
    try:
        if kind == 0x77:  # 'w'
            wal_start, wal_end, time = _ENVELOPE.unpack_from(data, 1)
            return XLogData(wal_start, wal_end, time + PG_EPOCH_OFFSET_US, data[1 + _ENVELOPE.size :])
        if kind == 0x6B:  # 'k'
            if len(data) != 1 + _KEEPALIVE.size:
                raise ProtocolError(f"primary keepalive message of {len(data)} bytes, expected 18")
            wal_end, time, reply = _KEEPALIVE.unpack_from(data, 1)
            return Keepalive(wal_end, time + PG_EPOCH_OFFSET_US, reply != 0)
    except struct.error as exc:
        raise ProtocolError(f"truncated replication message {chr(kind)!r} ({len(data)} bytes)") from exc
    raise ProtocolError(f"unknown replication CopyData message type {chr(kind)!r} (0x{kind:02x})")


def standby_status_update(
    written: int, flushed: int, applied: int, *, now_us: int, reply: bool = False
) -> bytes:
    """Build a standby status update ('r'): the LSNs written, flushed and applied by the client.

    ``now_us`` is the client clock in microseconds since the Unix epoch (the message counts from 2000-01-01);
    ``reply`` asks the server to answer with a keepalive at once.
    """
    try:
        return _STANDBY.pack(b"r", written, flushed, applied, now_us - PG_EPOCH_OFFSET_US, reply)
    except struct.error as exc:
        raise ValueError(f"LSN or time out of range for a standby status update: {exc}") from exc

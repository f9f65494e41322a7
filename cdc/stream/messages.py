"""What the replication stream carries, as frozen dataclasses: pgoutput's messages and their envelope.

Made by :mod:`cdc.stream.pgoutput` from bytes; read by the pipeline.

Conventions:

* LSNs, xids and OIDs are ints. Every ``*_time_us`` field is **microseconds since the Unix epoch** (UTC); the
  protocol counts from 2000-01-01 and the decoder converts (``PG_EPOCH_OFFSET_US``).
* Tuple values are ``None`` ('n', SQL NULL), :data:`UNCHANGED_TOAST` ('u', a TOASTed value the update did not
  change and the server did not send), ``bytes`` ('t', the column's text output, not decoded to ``str``: the
  caller decides) or :class:`BinaryValue`, a ``bytes`` subclass ('b', the type's binary send format, only when
  the ``binary`` option was requested).
* Names (schemas, relations, columns, types, message prefixes, GIDs) are decoded as UTF-8 with
  ``surrogateescape``; logical message contents stay ``bytes``.
* Inside a stream (protocol v2+ with ``streaming``, between Stream Start and Stream Stop) Relation, Type,
  Insert, Update, Delete, Truncate and Message carry an xid first: call ``decode(data, in_stream=True)``
  there; the message's ``xid`` is then set, otherwise it is ``None``. It is the xid of the (sub)transaction
  that made the change, not always the top-level xid of Stream Start / Stream Commit (Stream Abort names
  both; ``xid == subxid`` aborts the whole transaction).
* Stream Abort has two more fields (abort LSN and time) in protocol v4 with ``streaming = parallel``; the
  decoder tells the two layouts apart by length.
* The two-phase messages of v3 (Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, Stream Prepare),
  sent only when replication starts with ``two_phase 'on'``, are rejected with a ProtocolError that says so:
  the pipeline needs committed transactions only and never asks for them.
* Anything truncated, trailing, or of an unknown type raises :class:`~cdc.errors.ProtocolError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "PG_EPOCH_OFFSET_US",
    "UNCHANGED_TOAST",
    "Begin",
    "BinaryValue",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Keepalive",
    "LogicalMessage",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleValue",
    "TypeMessage",
    "UnchangedToast",
    "Update",
    "Values",
    "XLogData",
]

PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000
"""Microseconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01 00:00:00 UTC."""


class UnchangedToast(enum.Enum):
    """Type of the :data:`UNCHANGED_TOAST` sentinel (an enum: it survives pickling and type-checks)."""

    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast.UNCHANGED_TOAST


class BinaryValue(bytes):
    """A column value in the type's binary send format ('b'); plain ``bytes`` values are text ('t')."""

    __slots__ = ()


TupleValue: TypeAlias = bytes | UnchangedToast | None
Values: TypeAlias = tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class XLogData:
    wal_start: int
    wal_end: int
    send_time_us: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: int
    send_time_us: int
    reply_requested: bool


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class TypeMessage:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: Values
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """``key`` is the old replica identity ('K'), ``old`` the whole old row ('O'); at most one is set."""

    relation_oid: int
    new: Values
    old: Values | None = None
    key: Values | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Exactly one of ``key`` ('K') and ``old`` ('O') is set."""

    relation_oid: int
    old: Values | None = None
    key: Values | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    options: int
    xid: int | None = None

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``abort_lsn`` and ``abort_time_us`` are only sent by protocol v4 with ``streaming = parallel``."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_time_us: int | None = None


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMessage
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)

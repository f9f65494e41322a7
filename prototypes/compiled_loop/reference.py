"""The pure-Python path of `cdc run` for one captured batch, stage by stage, with the project's own code:
decode_insert_tuple -> EventRouter.row_fields -> route (topic, AvroEncoder.encoder_for) -> encode -> the
headers list of Pipeline._emit. Outputs (topic, key, value, headers): what Pipeline._emit hands
KafkaSink.produce."""

from __future__ import annotations

import struct
from pathlib import Path

from cdc.avro.encoder import AvroEncoder
from cdc.avro.store import SchemaStore
from cdc.config import Settings
from cdc.errors import format_lsn
from cdc.stream.messages import Begin, Relation
from cdc.stream.pgoutput import decode, decode_insert_tuple
from cdc.stream.route import EventRouter, parse_headers

ROOT = Path(__file__).resolve().parents[2]


def load_inputs(path: Path) -> list[bytes]:
    data = (path).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


class Reference:
    def __init__(self) -> None:
        self.settings = Settings(database_url="postgresql://unused", schemas_dir=ROOT / "schemas")
        self.router = EventRouter(self.settings)
        self.encoder = AvroEncoder(SchemaStore(ROOT / "schemas"))
        self.routes: dict[tuple[bytes, bytes, bytes], tuple[str, object]] = {}
        self.relation: Relation | None = None
        self.txn_lsn = b""
        self.txn_xid = b""
        self.txn_ts_ms = 0

    def route(self, at: bytes, et: bytes, version: bytes) -> tuple[str, object]:
        r = self.routes.get((at, et, version))
        if r is None:
            topic = self.router.topic(at.decode(), et.decode())
            r = self.routes[(at, et, version)] = (topic, self.encoder.encoder_for(et.decode(), int(version)))
        return r

    def other(self, data: bytes) -> None:
        """What the pipeline's _handle does with the messages that are not Inserts (Begin, Relation)."""
        message = decode(data[25:])
        if isinstance(message, Relation):
            self.router.relation(message)
            self.relation = message
        elif isinstance(message, Begin):
            self.txn_lsn = format_lsn(message.final_lsn).encode()
            self.txn_xid = str(message.xid).encode()
            self.txn_ts_ms = message.commit_time_us // 1000

    def event(self, data: bytes) -> tuple[str, bytes, bytes, list[tuple[str, bytes]], int] | None:
        oid, values = decode_insert_tuple(data, offset=25)
        if oid != self.router.outbox_oid:
            return None
        id_, at, aid, et, version, payload, raw_headers = self.router.row_fields(values)
        topic, encode = self.route(at, et, version)
        value = encode(payload)
        headers = [
            ("id", id_),
            ("event_type", et),
            ("schema_version", version),
            ("aggregate_type", at),
            ("commit_lsn", self.txn_lsn),
            ("xid", self.txn_xid),
        ]
        if raw_headers is not None:
            headers.extend(parse_headers(raw_headers))
        return topic, aid, value, headers, self.txn_ts_ms

    def run(self, messages: list[bytes]) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]], int]]:
        out = []
        for data in messages:
            if data[0] == 0x77 and data[25] == 0x49:
                e = self.event(data)
                if e is not None:
                    out.append(e)
            else:
                self.other(data)
        return out

"""Python glue around the Rust prototype: the reference path does what the compiled one hands back."""

from __future__ import annotations

from cdc.avro.encoder import MAGIC
from cdc.stream.messages import Relation
from cdc.stream.pgoutput import decode, decode_insert_tuple
from prototypes.compiled_loop.program import program
from prototypes.compiled_loop.reference import Reference


def loaded_librdkafka() -> str:
    """The path of the librdkafka confluent_kafka's cimpl loaded (its vendored copy, or the system's)."""
    import confluent_kafka  # noqa: F401  (loads it)

    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/librdkafka" in path and ".so" in path:
                return path
    raise RuntimeError("librdkafka is not loaded")


class Glue:
    def __init__(self, ref: Reference, dom: bool = False) -> None:
        from cdc_fastpath import FastPath

        self.fp = FastPath()
        self.fp.dom = dom
        self.ref = ref
        self.topics: list[str] = []
        self.python_only: set[tuple[bytes, bytes, bytes]] = set()
        self.fallbacks = 0

    def attach_producer(self, conf: dict[str, object]) -> str:
        return self.fp.attach_producer(loaded_librdkafka(), [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in conf.items()])

    def _other(self, data: bytes) -> None:
        self.ref.other(data)
        message = decode(data[25:]) if data[25] == 0x52 else None  # 'R'
        if isinstance(message, Relation) and self.ref.router.outbox_oid == message.oid:
            r = self.ref.router
            self.fp.set_layout(message.oid, r._pos, r._pos_version, r._pos_headers)

    def _learn(self, data: bytes) -> None:
        """A fallback event: give its route to the compiled path when its schema is one it takes."""
        _, values = decode_insert_tuple(data, offset=25)
        try:
            _, at, _, et, version, _, _ = self.ref.router.row_fields(values)
        except Exception:
            return
        key = (at, et, version)
        if key in self.python_only:
            return
        topic, _ = self.ref.route(at, et, version)
        stored = self.ref.encoder.store.get(et.decode(), int(version))
        prog = program(stored.parsed)
        if prog is None:
            self.python_only.add(key)
            return
        self.fp.add_route(at, et, version, MAGIC + stored.fingerprint, prog, topic)
        self.topics.append(topic)
        self.python_only.add(key)  # added once

    def run(self, messages: list[bytes], produce: bool = False) -> list[tuple]:
        out: list[tuple] = []
        call = self.fp.process_produce if produce else self.fp.process
        start = 0
        while start < len(messages):
            items, start = call(messages, start)
            self._items(messages, items, out)
        return out

    def _items(self, messages: list[bytes], items: list, out: list[tuple]) -> None:
        ref = self.ref
        for it in items:
            if type(it) is int:
                data = messages[it]
                if data[0] == 0x77 and data[25] == 0x49:
                    self.fallbacks += 1
                    e = ref.event(data)
                    if e is not None:
                        out.append(e)
                        self._learn(data)
                else:
                    self._other(data)
            else:
                route, key, value, headers = it
                out.append((self.topics[route], key, value, headers, ref.txn_ts_ms))

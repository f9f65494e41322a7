"""A stand-in for confluent_kafka.Message, for the pure decoding and dead-letter code (a real Message cannot
be built outside a consumer)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Message:
    _value: bytes | None = b"\xc3\x01..."
    _headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    _key: bytes | None = b"o-1"

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def topic(self) -> str | None:
        return "outbox.event.order"

    def partition(self) -> int | None:
        return 2

    def offset(self) -> int | None:
        return 41

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

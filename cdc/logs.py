"""Logging set-up: one line per lifecycle event, as text or JSON (``--log-format json``), librdkafka's
own lines (logger ``cdc.kafka``) throttled, and the Python stack of a native crash
(:func:`enable_crash_dumps`).

Nothing here redacts: the rule is that payloads, passwords and DSNs are never handed to a logger in the first
place (``config.describe_dsn`` gives the loggable form of a DSN).

A row is data, never control: what comes from an outbox row (an id, an event type, a topic made of its
names) is shown through :func:`shown` (quoted, cut short), and both formatters escape whatever control,
line-breaking or bidirectional characters a message still holds and cut it at :data:`MAX_MESSAGE`, so that
no value can end a log line, forge the next one, or drive the terminal of whoever reads the log.
"""

from __future__ import annotations

import faulthandler
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

import orjson

SHOWN_LIMIT = 60  # characters of a row's value in a message
MAX_MESSAGE = 2000  # characters of one log message; the rest is cut, and the cut said
# C0 and C1 controls (newlines, ESC, BEL), DEL, the line and paragraph separators, and the invisible format
# characters that reorder or hide text (bidi embeddings, overrides and isolates, zero-width marks, the BOM).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")


def shown(value: str | bytes | None, limit: int = SHOWN_LIMIT) -> str:
    """A value from a row, for a message: quoted (so that it cannot pass for the message's own words), its
    control and format characters escaped, cut to ``limit`` characters with the cut said."""
    if value is None:
        return "(none)"
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    cut = len(text) - limit
    quoted = repr(text[:limit] if cut > 0 else text)  # repr escapes what is not printable
    return f"{quoted}... (+{cut} characters)" if cut > 0 else quoted


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_message(message: str) -> str:
    """One line, whatever the message holds: control and format characters escaped, cut at MAX_MESSAGE."""
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE} characters cut)"
    return _UNSAFE.sub(_escape, message)


class TextFormatter(logging.Formatter):
    """``<time> <level> <logger>: <message>``, the message made safe (a traceback keeps its lines)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = safe_message(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": safe_message(record.getMessage()),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    enable_crash_dumps()
    # The registry client's HTTP library logs every request at INFO: one line per schema lookup is noise,
    # and a URL is not ours to print unredacted.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def log_stream() -> TextIO | None:
    """Where the log lines go: the stream of the root logger's first stream handler that has a file
    descriptor (what configure_logging set, or the service's own logging), else stderr."""
    for handler in logging.getLogger().handlers:
        stream: TextIO | None = getattr(handler, "stream", None)
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor (captured, closed)
            continue
    for fallback in (sys.stderr, sys.__stderr__):
        try:
            if fallback is not None and fallback.fileno() >= 0:
                return fallback
        except (AttributeError, OSError, ValueError):
            continue
    return None


def enable_crash_dumps() -> bool:
    """A native crash (a segmentation fault, an abort, a bus error) writes the Python stack of every thread
    to the log's stream before the process dies: which call crashed, in the same place as the log lines
    before it (``faulthandler``, plain text lines even under ``--log-format json``). False when there is no
    stream with a file descriptor to write to.

    Not caught this way: a fault inside one of librdkafka's own threads (``rdk:main``, ``rdk:broker*``),
    which block every signal, so that the kernel kills the process without running any handler; its log
    names the thread (docs/operations.md, "A crash")."""
    stream = log_stream()
    if stream is None:
        return False
    faulthandler.enable(file=stream, all_threads=True)
    return True


kafka_log = logging.getLogger("cdc.kafka")

# librdkafka's own retries while a new broker loads its coordinators: expected, and retried on its own.
# And its note at every start that enable.gapless.guarantee is "experimental": it is what we rely on.
_BENIGN = re.compile(
    r"Failed to acquire (idempotence|transactional) PID .*Coordinator load in progress"
    r"|property enable\.gapless\.guarantee is experimental"
)
KAFKA_LOG_INTERVAL = 10.0  # seconds: librdkafka lines of one kind at most this often


class KafkaLogThrottle(logging.Filter):
    """librdkafka's log lines, as the sink does its own warnings: one line per kind (level and facility) every
    ``interval`` seconds, the next one saying how many were held back. A broker outage makes librdkafka log
    every failed connect at ERROR, dozens at once; the benign retries of a broker that is still loading its
    coordinators at start-up go to DEBUG."""

    def __init__(
        self, interval: float = KAFKA_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._last: dict[tuple[int, str], tuple[float, int]] = {}  # kind -> (when shown, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        facility = str(args[0]) if args else ""
        if record.levelno > logging.DEBUG and _BENIGN.search(str(args[-1]) if args else record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        if record.levelno < logging.getLogger(record.name).getEffectiveLevel():
            return False
        if record.levelno < logging.WARNING:
            return True
        kind = (record.levelno, facility)
        now = self.clock()
        shown, held = self._last.get(kind, (-self.interval, 0))
        if now - shown < self.interval:
            self._last[kind] = (shown, held + 1)
            return False
        self._last[kind] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {now - shown:.0f} s)"
        return True


_throttle = KafkaLogThrottle()
kafka_log.addFilter(_throttle)

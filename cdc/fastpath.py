"""The compiled extension ``cdc._fastpath`` (``rust/``): whether it is installed, and whether to use it.

It holds the parts of the hot path that Python spends most of its time on: the Avro encoder
(:mod:`cdc.avro.compiled`) and the reader of outbox rows from pgoutput Inserts (:mod:`cdc.stream.route`);
and, when tracing is on, a sampled row's new ``traceparent`` (:func:`cdc.trace_context.plain_child`) and
the writer of the relay's spans for the exporter (:mod:`cdc.trace_export`). Each is only ever right or
absent: on anything it is not sure of it hands over to the Python code, which is the reference, and tests
hold it to that code byte for byte (``tests/unit/avro/test_compiled.py``,
``tests/unit/stream/test_compiled_rows.py``, ``tests/unit/test_trace_export_compiled.py``,
``tests/unit/test_trace_context.py``).

The setting ``fast_path``: ``auto`` uses the extension when it was built (``make install`` builds it when
cargo 1.77 or later is on PATH; the Docker image always has it), ``off`` never, ``required`` refuses to start
without it.
"""

from __future__ import annotations

import logging
from types import ModuleType

from cdc.errors import ConfigError

__all__ = ["available", "enabled", "extension"]

log = logging.getLogger("cdc.pipeline")

extension: ModuleType | None
try:
    from cdc import _fastpath as extension
except ImportError as exc:  # not built: no cargo at install time, or an install without the build
    extension = None
    _MISSING = str(exc)
else:
    _MISSING = ""


def available() -> bool:
    return extension is not None


def enabled(mode: str) -> bool:
    """Whether to use the extension under ``fast_path = mode``; logs which path is used."""
    if mode == "off":
        log.info("hot path: Python (fast_path = off)")
        return False
    if extension is None:
        if mode == "required":
            raise ConfigError(
                "setting 'fast_path' is 'required' but the compiled extension cdc._fastpath is not installed "
                f"({_MISSING}): install with cargo 1.77 or later on PATH (`make install`, or the Docker "
                "image), or set fast_path = 'auto'",
                key="fast_path",
            )
        log.warning(
            "hot path: Python, slower: the compiled extension cdc._fastpath is not installed (reinstall "
            "with cargo 1.77 or later on PATH; fast_path = 'off' says it is meant)"
        )
        return False
    log.info("hot path: compiled (cdc._fastpath: outbox rows and Avro), Python for what it does not take")
    return True

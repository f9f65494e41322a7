"""What a record's ``traceparent`` may be, whether ``cdc run`` traces or not.

With tracing off the row's ``traceparent`` passes as it came; with tracing on (CI runs the suite with Jaeger,
so `cdc run` exports spans) the record carries the relay's send span instead: the same version, trace id and
flags, a span id of its own. Tests of headers accept both; tests/integration/test_tracing.py tells them apart.
"""

from __future__ import annotations


def continues(traceparent: bytes | str, parent: str) -> bool:
    """``traceparent`` is ``parent`` itself or a child of it (same trace and flags)."""
    got = traceparent.decode() if isinstance(traceparent, bytes) else traceparent
    mine, theirs = got.split("-"), parent.split("-")
    return (
        len(mine) == len(theirs) == 4
        and (mine[0], mine[1], mine[3]) == (theirs[0], theirs[1], theirs[3])
        and len(mine[2]) == 16
        and mine[2] != "0" * 16
    )

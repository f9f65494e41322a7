"""How a `cdc` process ends: never with a Kafka client's threads still running.

librdkafka's threads (``rdk:main``, ``rdk:broker1``...) belong to a client until its destroy joins them. A
client still alive when the interpreter finishes keeps them running while Python tears its modules down and
OpenSSL's exit handler frees its state. A broker thread that still reads or writes TLS then crashes the
process: SIGSEGV in ``rdk:broker*`` after the command's last line, with no Python stack, since faulthandler is
off by then (and librdkafka's threads block signals anyway). A script that exits with three clients whose SASL
password the broker refuses crashed 5 times in 280 exits here, and `cdc run`'s refused start once in CI: an
exit code of -11 instead of 2 or 0 tells a supervisor the wrong thing.

The commands destroy their clients (:meth:`cdc.stream.sink.KafkaSink.close`); :func:`end` is the net under
them. It collects the garbage first (a client in a cycle is destroyed there). If a client is still alive, it
logs a warning that names its threads, runs the interpreter's exit functions, flushes the output, and ends the
process with ``os._exit``: no teardown for the threads to crash into. docs/operations.md, "A crash".
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

__all__ = ["end", "exit_status", "librdkafka_thread_ids", "librdkafka_threads"]

log = logging.getLogger("cdc")

TASKS = Path("/proc/self/task")


def librdkafka_threads(tasks: Path = TASKS) -> list[str]:
    """The names of this process's librdkafka threads, sorted; empty where there is no /proc."""
    return sorted(librdkafka_thread_ids(tasks).values())


def librdkafka_thread_ids(tasks: Path = TASKS) -> dict[int, str]:
    """This process's librdkafka threads: their names by thread id; empty where there is no /proc."""
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return {}
    threads = {}
    for task in entries:
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # a thread that ended meanwhile
            continue
        if name.startswith("rdk:") and task.name.isdigit():
            threads[int(task.name)] = name
    return threads


def exit_status(exc: SystemExit) -> int:
    """The exit status the interpreter would give for ``exc``: its code, 0 for None, and 1 (with the
    value on stderr) for anything else, as ``sys.exit("message")`` does."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def end(code: int) -> NoReturn:
    """End the process with ``code``: the interpreter's own exit when no librdkafka thread runs, else
    ``os._exit`` after the exit functions (see the module's docstring)."""
    threads = librdkafka_threads()
    if threads:
        # A client that only a cycle keeps (its error callback is a method of its owner) is garbage;
        # start-up's gc.freeze() hides it from the collector until unfrozen.
        gc.unfreeze()
        gc.collect()
        threads = librdkafka_threads()
    if not threads:
        sys.exit(code)
    log.warning(
        "a Kafka client is still open at exit (threads %s): ending without the interpreter's teardown, "
        "which they could crash (exit code %d kept)",
        ", ".join(threads),
        code,
    )
    atexit._run_exitfuncs()  # what sys.exit would run: logging's shutdown, the tracer provider's flush
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)

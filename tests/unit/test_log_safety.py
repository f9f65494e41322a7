"""A row is data, never control (issue 44, item 1): no value that reaches a log message can end its line,
forge the next one, or drive the reader's terminal, in either log format.

Every log call of the package is found in its syntax tree, not listed: each is formatted through both
formatters that `configure_logging` installs, with hostile text in every argument that takes text."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import orjson
import pytest

from cdc.logs import MAX_MESSAGE, JsonFormatter, TextFormatter, configure_logging, safe_message, shown

PACKAGE = Path(__file__).resolve().parents[1].parent / "cdc"
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}
FORGED = "NoSuchEvent\n2026-12-07 00:00:00,000 ERROR cdc.pipeline: FORGED"
HOSTILE = [
    FORGED,
    "a\r\nb",
    "\x1b[2J\x1b[31mred\x07",  # clear the screen, colour, bell
    "abc\u202edcba",  # right-to-left override
    "x\u2066y\u2069z\u200b",  # an isolate and a zero-width space
    "\u2028next\u2029para",
    "x" * 10_000,
]
# What no line of the log may hold: C0/C1 controls, DEL, line separators, bidi and zero-width characters.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def log_calls() -> list[tuple[str, str, list[str]]]:
    """(where, format string, conversion of each argument) of every log call with a literal format."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOG_METHODS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            fmt = node.args[0].value
            conversions = re.findall(r"%[-#0 +]*\d*(?:\.\d+)?([sdrfgixX%])", fmt)
            conversions = [c for c in conversions if c != "%"]
            if len(conversions) != len(node.args) - 1:
                continue  # not a %-format call of logging (an f-string's result, a dict format)
            found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", fmt, conversions))
    return found


CALLS = log_calls()


def test_the_package_logs_through_calls_the_tree_finds():
    assert len(CALLS) > 80, "the scan found too few log calls: is it still finding them?"


def _value(conversion: str, text: str) -> object:
    return text if conversion in "sr" else 7 if conversion in "dixX" else 1.5


@pytest.mark.parametrize("where,fmt,conversions", CALLS, ids=[c[0] for c in CALLS])
def test_every_log_call_makes_one_safe_line_whatever_its_arguments(where, fmt, conversions):
    for text in HOSTILE:
        record = logging.LogRecord(
            "cdc.test", logging.WARNING, where, 1, fmt, tuple(_value(c, text) for c in conversions), None
        )
        line = TextFormatter().format(record)
        assert "\n" not in line and not UNSAFE.search(line), (where, line[:200])
        assert len(line) < MAX_MESSAGE + 200, (where, len(line))
        entry = orjson.loads(JsonFormatter().format(record))
        assert not UNSAFE.search(entry["message"]), (where, entry["message"][:200])
        assert len(entry["message"]) < MAX_MESSAGE + 100


def test_a_row_value_is_quoted_escaped_and_cut():
    assert shown("OrderPlaced") == "'OrderPlaced'"
    assert shown(b"Order\nPlaced") == "'Order\\nPlaced'"
    assert shown("\x1b[2J\u202e") == "'\\x1b[2J\\u202e'"
    long = shown("y" * 10_000)
    assert long.startswith("'" + "y" * 60 + "'") and long.endswith("(+9940 characters)")
    assert len(long) < 100


def test_a_message_is_one_line_and_cut():
    assert safe_message("a\nb") == "a\\x0ab"
    assert safe_message("\u202e") == "\\u202e"
    assert safe_message("é, 日本, ✓") == "é, 日本, ✓"  # printable text is left alone
    cut = safe_message("z" * (MAX_MESSAGE + 500))
    assert cut.endswith("(500 characters cut)") and len(cut) < MAX_MESSAGE + 40


def test_a_traceback_keeps_its_lines_but_its_message_line_does_not(capsys):
    configure_logging("INFO", "text")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("cdc.test").exception("failed on %s", FORGED)
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert "FORGED" in first and "\\x0a" in first
    assert rest[0].startswith("Traceback") and not any("FORGED" in line for line in rest)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_configure_logging_installs_the_safe_formatters(fmt):
    configure_logging("INFO", fmt)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler.formatter, JsonFormatter if fmt == "json" else TextFormatter)


def test_no_module_installs_a_formatter_of_its_own():
    """Every line goes through cdc.logs: a handler set up elsewhere would escape nothing."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "logs.py":
            continue
        text = path.read_text()
        assert "setFormatter(" not in text and "logging.Formatter(" not in text, path

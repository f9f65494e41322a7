"""``database_url`` checked when the settings are read, not when the first connection fails: the scheme of a
URI, libpq's keywords (an unknown one gets a did-you-mean), the port, and the values of the keywords that
take a word or a number (``sslmode``, ``target_session_attrs``, ``connect_timeout``...). Each refusal is a
:class:`~cdc.errors.ConfigError` (exit 2) naming ``database_url`` and what to change.

Keywords, schemes, ports and ``sslmode`` are not secrets, and are named; the password never is. A value is
shown only where no password can have leaked into it: a URI's user or password holding an unencoded ``/``
or ``@`` parses as a host and a port (``postgresql://u:pa/ss@h`` is host ``u``, port ``pa``), so a port
that is not a number is shown only in ``key=value`` form, and the hint then is the percent-encoding.
"""

from __future__ import annotations

import difflib
import re

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from cdc.errors import ConfigError

__all__ = ["check_database_url"]

_URI_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*(?::[A-Za-z][A-Za-z0-9+.-]*)*)://")
_UNKNOWN = re.compile(r'invalid (?:URI query parameter|connection option):? "(\w+)"')
# libpq's keywords that take one of a few words (libpq's documentation, "Parameter Key Words").
_WORDS = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
}
_NUMBERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")
_SHOWABLE = re.compile(r"[\w.+-]{1,40}")


def _keywords() -> list[str]:
    return [option.keyword.decode() for option in pq.Conninfo.get_defaults()]


def _refuse(where: str, problem: str) -> ConfigError:
    return ConfigError(f"setting 'database_url'{where} {problem}", key="database_url")


def check_database_url(url: str, where: str = "") -> None:
    """Refuse a ``database_url`` libpq would refuse or misread at connect time. ``where``: its source, as
    `` (from CDC_DATABASE_URL)``."""
    scheme = _SCHEME.match(url)
    if scheme is not None and scheme.group(1).lower() not in _URI_SCHEMES:
        name = scheme.group(1)
        fix = (
            f"drop the '{name.split(':', 1)[0]}:' prefix (a JDBC URL): "
            if name.lower().startswith("jdbc:")
            else ""
        )
        raise _refuse(
            where,
            f"is a URI of scheme '{name}://': {fix}libpq reads postgresql:// (or postgres://) URIs, "
            "as postgresql://user@host:5432/dbname?sslmode=verify-full, or key=value pairs",
        )
    uri = scheme is not None
    try:
        parsed = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        unknown = _UNKNOWN.search(str(exc))
        if unknown is None:
            # libpq's message quotes the text around the fault, which may be the password: never shown.
            raise _refuse(
                where,
                "is not a connection string libpq can read: write a URI (postgresql://user@host:5432/dbname) "
                "or key=value pairs, quoting a value with spaces or quotes as password='a b' and "
                "percent-encoding such characters in a URI (its text is not shown: it may hold a password)",
            ) from None
        word = unknown.group(1)
        hint = difflib.get_close_matches(word, _keywords(), n=1)
        raise _refuse(
            where,
            f"has the keyword '{word}', which libpq does not know"
            + (f": did you mean '{hint[0]}'?" if hint else " (libpq's documentation lists its keywords)"),
        ) from None
    params = {key: str(value) for key, value in parsed.items()}
    _check_ports(params.get("port"), where, uri)
    for key, words in _WORDS.items():
        value = params.get(key)
        if value is not None and value not in words:
            shown = f" '{value}'" if _SHOWABLE.fullmatch(value) else ""
            close = difflib.get_close_matches(value, words, n=1) if shown else []
            raise _refuse(
                where,
                f"has {key}{shown}, which libpq does not take: "
                + (f"did you mean '{close[0]}'? " if close else "")
                + f"{key} is one of {', '.join(words)}",
            )
    for key in _NUMBERS:
        value = params.get(key)
        if value is not None and not re.fullmatch(r"\s*\d+\s*", value):
            raise _refuse(where, f"has a {key} that is not a whole number of seconds (or a count)")


def _check_ports(ports: str | None, where: str, uri: bool) -> None:
    """Every port of a (multi-host) ``port`` is a number from 1 to 65535; an empty one is the default."""
    if ports is None:
        return
    for port in ports.split(","):
        port = port.strip()
        if port == "" or (port.isdigit() and 1 <= int(port) <= 65535):
            continue
        if port.isdigit():
            raise _refuse(where, f"has port {port}, which is not a port number (1-65535)")
        if uri:
            raise _refuse(
                where,
                "has a port that is not a number (not shown: it may be part of the password). In a URI a "
                "'/' or '@' in the user or password must be percent-encoded ('/' as %2F, '@' as %40, ':' "
                "as %3A), or libpq reads what follows it as the host and the port; a port is a number "
                "from 1 to 65535",
            )
        shown = f" '{port}'" if _SHOWABLE.fullmatch(port) else ""
        raise _refuse(where, f"has port{shown}, which is not a port number (1-65535)")

"""The JSON forms of Avro's logical types and of bytes, read into the values that Avro writes.

A payload comes from a ``jsonb`` column, so it holds what PostgreSQL's ``to_jsonb`` and
``jsonb_build_object`` make of a row's columns, and jsonb cannot hold ``\\u0000``. The encoders compiled by
:mod:`cdc.avro.codegen` call the readers here for the fields whose type asks for them (the table of forms is
in the docstring of :mod:`cdc.avro.encoder`):

- decimal: a JSON number or a decimal string, read exactly (the encoder parses the payloads of a schema with
  a decimal with ``parse_float=Decimal``, never through a float), scaled to the schema's scale; a digit that
  the scale or the precision cannot hold is an error, never rounded. With a ``cdc.encoding``, a string is the
  two's-complement bytes in that encoding instead, as before.
- timestamp-millis/micros: an ISO-8601 date-time with a UTC offset; local-timestamp-*: one without; date:
  ``YYYY-MM-DD``; time-millis/micros: ``HH:MM:SS[.ffffff]``. A digit beyond the type's unit is an error,
  never truncated (zeros excepted).
- bytes and fixed: a string in the field's ``cdc.encoding``: ``latin1`` (the default, Avro's JSON encoding:
  one code point U+0000..U+00FF a byte), ``base64`` (RFC 4648, padded; line breaks allowed, as PostgreSQL's
  ``encode(b, 'base64')`` writes them) or ``hex`` (``\\x0a1b``, a bytea column's own text, or ``0a1b``).
- uuid: an RFC 4122 string (8-4-4-4-12 hex digits); on a fixed(16), that string or the 16 bytes in the
  field's encoding.

Every reader takes ``(path, label, value)`` and raises :class:`~cdc.avro.runtime.Invalid` naming what was
expected and what kind of value came, never the value.
"""

from __future__ import annotations

import binascii
import datetime
import re
from collections.abc import Callable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Final

from cdc.avro.runtime import Invalid

__all__ = [
    "ENCODING",
    "ENCODINGS",
    "TIME_KINDS",
    "DecimalForm",
    "decode_bytes",
    "uuid_fixed",
    "uuid_string",
]

ENCODING: Final = "cdc.encoding"  # the schema property, on a bytes or fixed type or on a field
ENCODINGS: Final = ("latin1", "base64", "hex")

Path = tuple[object, ...]
Reader = Callable[[Path, str, str], int]

# --- bytes --------------------------------------------------------------------------------------------------

_HEX: Final = re.compile(r"(?:\\x)?((?:[0-9a-fA-F]{2})*)\Z")
_NOT_BASE64: Final = "got string that is not base64 (RFC 4648, padded; line breaks allowed)"


def _latin1(path: Path, label: str, text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise Invalid(path, f"expects {label} (code points U+0000..U+00FF), got string") from None


def _base64(path: Path, label: str, text: str) -> bytes:
    try:
        return binascii.a2b_base64(text.replace("\n", "").replace("\r", ""), strict_mode=True)
    except (binascii.Error, ValueError):  # ValueError: a character beyond ASCII
        raise Invalid(path, f"expects {label}, {_NOT_BASE64}") from None


def _hex(path: Path, label: str, text: str) -> bytes:
    match = _HEX.match(text)
    if match is None:
        raise Invalid(
            path, f"expects {label}, got string that is not hex (\\x0a1b or 0a1b, two digits a byte)"
        )
    return bytes.fromhex(match.group(1))


_DECODERS: Final = {"latin1": _latin1, "base64": _base64, "hex": _hex}


def decode_bytes(encoding: str) -> Callable[[Path, str, str], bytes]:
    """The reader of a string in ``encoding`` (one of :data:`ENCODINGS`)."""
    return _DECODERS[encoding]


# --- decimal ------------------------------------------------------------------------------------------------

# A JSON number, with a sign allowed and leading zeros: what PostgreSQL's numeric and Java's BigDecimal write.
_DECIMAL_TEXT: Final = re.compile(r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\Z", re.ASCII)
_NOT_FINITE: Final = re.compile(r"[+-]?(?:nan|inf|infinity)\Z", re.IGNORECASE)


_EXACT: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)  # scaleb in it never rounds


class DecimalForm:
    """The readers of one decimal schema: ``number`` for a JSON number (``int`` or ``Decimal``), ``string``
    for a string. Both return the two's-complement bytes: minimal for bytes, ``size`` of them for a fixed."""

    def __init__(self, precision: int, scale: int, size: int | None, encoding: str | None) -> None:
        self.precision, self.scale, self.size = precision, scale, size
        self.factor, self.limit = 10**scale, 10**precision
        self.decode = None if encoding is None else decode_bytes(encoding)

    def number(self, path: Path, label: str, value: int | Decimal) -> bytes:
        if isinstance(value, Decimal):
            return self._bytes(self._unscaled(path, label, value, "number"))
        unscaled = value * self.factor
        if not -self.limit < unscaled < self.limit:
            raise Invalid(path, f"expects {label}, got number of more than {self.precision} digits")
        return self._bytes(unscaled)

    def string(self, path: Path, label: str, text: str) -> bytes:
        if self.decode is not None:  # the two's-complement bytes, in the field's encoding
            raw = self.decode(path, label, text)
            if not raw:
                raise Invalid(path, f"expects {label}, got no bytes (two's complement takes one at least)")
            if self.size is not None and len(raw) != self.size:
                raise Invalid(path, f"expects {label} of {self.size} bytes, got another length")
            if not -self.limit < int.from_bytes(raw, "big", signed=True) < self.limit:
                raise Invalid(
                    path, f"expects {label}, got bytes of a number of more than {self.precision} digits"
                )
            return raw
        if not _DECIMAL_TEXT.match(text):
            if _NOT_FINITE.match(text):
                raise Invalid(path, f"expects {label}, got NaN or Infinity, which a decimal cannot hold")
            raise Invalid(path, f"expects {label}, got string that is not a decimal number (-123.45, 1.5E+3)")
        return self._bytes(self._unscaled(path, label, Decimal(text), "string"))

    def _unscaled(self, path: Path, label: str, value: Decimal, what: str) -> int:
        """The exact unscaled integer of ``value`` at the schema's scale, or Invalid: nothing is rounded."""
        if not value.is_finite():
            raise Invalid(path, f"expects {label}, got NaN or Infinity, which a decimal cannot hold")
        if not value:
            return 0
        # adjusted(): the exponent of the first digit. Checked first, so that 1e999999999 is never built.
        if value.adjusted() + 1 + self.scale > self.precision:
            raise Invalid(path, f"expects {label}, got {what} of more than {self.precision} digits")
        scaled = value.scaleb(self.scale, _EXACT)
        unscaled = int(scaled)
        if scaled != unscaled:  # a digit beyond the scale that is not a zero
            raise Invalid(
                path,
                f"expects {label}, got {what} with more than {self.scale} digits after the point "
                "(it is never rounded)",
            )
        return unscaled

    def _bytes(self, unscaled: int) -> bytes:
        if self.size is not None:  # the precision fits the size (checked with the schema): no overflow
            return unscaled.to_bytes(self.size, "big", signed=True)
        length = ((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8) // 8  # as BigInteger's
        return unscaled.to_bytes(length, "big", signed=True)


# --- dates and times ----------------------------------------------------------------------------------------

_DATE_TIME: Final = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?\Z",
    re.ASCII,
)
_DATE: Final = re.compile(r"(\d{4})-(\d\d)-(\d\d)\Z", re.ASCII)
_TIME: Final = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d(?::?\d\d){0,2})?\Z", re.ASCII)
_EPOCH_DAY: Final = datetime.date(1970, 1, 1).toordinal()
_MICRO: Final = datetime.timedelta(microseconds=1)
_ISO_DATE_TIME: Final = "an ISO-8601 date-time, YYYY-MM-DDTHH:MM:SS[.ffffff]"


def _days(path: Path, label: str, year: str, month: str, day: str) -> int:
    try:
        return datetime.date(int(year), int(month), int(day)).toordinal() - _EPOCH_DAY
    except ValueError:
        raise Invalid(path, f"expects {label}, got a date that does not exist (or before year 1)") from None


def _seconds(path: Path, label: str, hour: str, minute: str, second: str) -> int:
    h, m, s = int(hour), int(minute), int(second)
    if h > 23 or m > 59 or s > 59:  # 24:00:00 and leap seconds have no Avro value
        raise Invalid(path, f"expects {label}, got a time of day that does not exist (00:00:00..23:59:59)")
    return (h * 60 + m) * 60 + s


def _fraction(path: Path, label: str, digits: str | None, places: int, unit: str) -> int:
    if digits is None:
        return 0
    if len(digits) > places and digits[places:].strip("0"):
        raise Invalid(path, f"expects {label}, got a value more precise than {unit} (it is never truncated)")
    return int(digits[:places].ljust(places, "0"))


def _timestamp(label_unit: tuple[int, str], local: bool) -> Reader:
    places, unit = label_unit
    scale = 10**places
    epoch_naive = datetime.datetime(1970, 1, 1)
    epoch = epoch_naive.replace(tzinfo=datetime.UTC)

    def read(path: Path, label: str, text: str) -> int:
        match = _DATE_TIME.match(text)
        if match is None:
            offset = "" if local else " and a UTC offset (Z, +HH:MM)"
            raise Invalid(path, f"expects {label}, got string that is not {_ISO_DATE_TIME}{offset}")
        year, month, day, hour, minute, second, frac, zulu, sign, *parts = match.groups()
        if local and (zulu or sign):
            raise Invalid(
                path,
                f"expects {label}, got a date-time with a UTC offset: a local timestamp takes none "
                "(to_jsonb(timestamp), not timestamptz); use timestamp-millis or -micros for an instant",
            )
        if not local and not (zulu or sign):
            raise Invalid(
                path,
                f"expects {label}, got a date-time without a UTC offset: an instant needs one (Z, +HH:MM, "
                "as to_jsonb(timestamptz) writes it); a wall-clock time goes in a local-timestamp-millis "
                "or -micros",
            )
        if any(part and part > "59" for part in parts[1:]):  # datetime would take +05:60 for +06:00
            raise Invalid(path, f"expects {label}, got a UTC offset that does not exist")
        if frac is not None and len(frac) > places:
            _fraction(path, label, frac, places, unit)  # zeros beyond the unit, or Invalid
        try:  # the common case, in C; the regular expression made sure of the form
            since = datetime.datetime.fromisoformat(text) - (epoch_naive if local else epoch)
            micros: int = since // _MICRO
            return micros if places == 6 else micros // 1000
        except (ValueError, OverflowError):  # a lower-case z, a day or an hour that does not exist...
            pass
        seconds = _days(path, label, year, month, day) * 86400 + _seconds(path, label, hour, minute, second)
        if sign:
            oh, om, os_ = (int(part or 0) for part in parts)
            seconds -= (oh * 3600 + om * 60 + os_) * (1 if sign == "+" else -1)
        instant: int = seconds * scale + _fraction(path, label, frac, places, unit)
        return instant

    return read


def _date(path: Path, label: str, text: str) -> int:
    match = _DATE.match(text)
    if match is None:
        raise Invalid(path, f"expects {label}, got string that is not a date YYYY-MM-DD")
    return _days(path, label, *match.groups())


def _time(places: int, unit: str) -> Reader:
    def read(path: Path, label: str, text: str) -> int:
        match = _TIME.match(text)
        if match is None:
            raise Invalid(path, f"expects {label}, got string that is not a time HH:MM:SS[.ffffff]")
        hour, minute, second, frac, offset = match.groups()
        if offset:
            raise Invalid(path, f"expects {label}, got a time with a UTC offset: a time of day takes none")
        of_day: int = _seconds(path, label, hour, minute, second) * 10**places
        return of_day + _fraction(path, label, frac, places, unit)

    return read


_MILLIS, _MICROS = (3, "milliseconds"), (6, "microseconds")

# logicalType: (its Avro type, the reader of its string form)
TIME_KINDS: Final[dict[str, tuple[str, Reader]]] = {
    "date": ("int", _date),
    "time-millis": ("int", _time(*_MILLIS)),
    "time-micros": ("long", _time(*_MICROS)),
    "timestamp-millis": ("long", _timestamp(_MILLIS, local=False)),
    "timestamp-micros": ("long", _timestamp(_MICROS, local=False)),
    "local-timestamp-millis": ("long", _timestamp(_MILLIS, local=True)),
    "local-timestamp-micros": ("long", _timestamp(_MICROS, local=True)),
}

# --- uuid ---------------------------------------------------------------------------------------------------

_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_NOT_UUID: Final = "got string that is not a UUID (8-4-4-4-12 hex digits)"


def uuid_string(path: Path, label: str, text: str) -> None:
    """Checks a uuid string: Java's UUIDConversion (and fastavro's reader) fail on anything else."""
    if not _UUID.match(text):
        raise Invalid(path, f"expects {label}, {_NOT_UUID}")


def uuid_fixed(encoding: str) -> Callable[[Path, str, str], bytes]:
    """The reader of a uuid on a fixed(16): the RFC 4122 string, or the 16 bytes in ``encoding``."""
    decode = decode_bytes(encoding)

    def read(path: Path, label: str, text: str) -> bytes:
        if len(text) == 36 and _UUID.match(text):
            return bytes.fromhex(text.replace("-", ""))
        raw = decode(path, label, text)
        if len(raw) != 16:
            raise Invalid(path, f"expects {label}, {_NOT_UUID} nor 16 bytes in {encoding}")
        return raw

    return read

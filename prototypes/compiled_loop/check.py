"""Byte-for-byte: the compiled path against the reference on the captured inputs, plus edge payloads."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from prototypes.compiled_loop.fastpath import Glue
from prototypes.compiled_loop.reference import Reference, load_inputs

HERE = Path(__file__).parent

EDGE_PAYLOADS = [
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": -9223372036854775808, "currency": "", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 9223372036854775808, "currency": "E", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1.0, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1e3, "currency": "EUR", "items": []}',
    b'{"order_id": "\\u00e9\\ud83d\\ude00\\n\\"", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'{"order_id": "\\ud800", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "x": 1}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR"}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [{"sku": "s", "quantity": 2147483648}]}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [{"sku": "s", "quantity": -2147483648}]}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [{"sku": "s", "quantity": true}]}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "coupon": null}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "coupon": 5}',
    b'{"order_id": "o", "order_id": "p", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'not json',
    b'[1]',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []} ',
    b'\xff',
    b'{"items": [{"quantity": 3, "sku": "s"}, {"sku": "t", "quantity": 0}], "currency": "EUR", "order_id": "o", "customer_id": "c", "amount_cents": -0}',
    b'{"items":[{"quantity":3,"sku":"s"}],"currency":"EUR","order_id":"o","customer_id":"c","amount_cents":12,"coupon":"\\u00ff"}',
    b' \n{"\\u006frder_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}\t',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1E5, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 01, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [],}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [{"sku": "s", "quantity": 1}, ]}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [{"sku": "s", "quantity": 1, "sku": "t"}]}',
    b'{"order_id": "o\x01", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'{"order_id": "\xc3\xa9\xe2\x82\xac\\ud83d\\ude00 \\/\\b\\f\\r\\t", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 18446744073709551615, "currency": "EUR", "items": []}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "coupon": "x"} x',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "coupon": nul}',
    b'{"order_id": "o", "customer_id": "c", "amount_cents": 1, "currency": "EUR", "items": [], "coupon": "\\ud83d"}',
]


def with_payload(template: bytes, payload: bytes, version: bytes, headers: bytes | None) -> bytes:
    """An Insert message like ``template`` (the outbox layout of capture.py) with other column values."""
    count = struct.unpack_from(">H", template, 31)[0]
    pos, cols = 33, []
    for _ in range(count):
        kind = template[pos]
        if kind == ord("t"):
            (n,) = struct.unpack_from(">I", template, pos + 1)
            cols.append(template[pos + 5 : pos + 5 + n])
            pos += 5 + n
        else:
            cols.append(None)
            pos += 1
    cols[4], cols[5], cols[7] = version, headers, payload  # schema_version, headers, payload
    body = b"".join(b"n" if c is None else b"t" + struct.pack(">I", len(c)) + c for c in cols)
    return template[:33] + body


def outcome(run, msgs):
    try:
        return ("ok", run(msgs))
    except Exception as exc:  # the reference's error, which the fallback must reproduce
        return ("error", type(exc).__name__, str(exc))


def main() -> int:
    messages = load_inputs(HERE / "inputs.bin")
    ref_out = Reference().run(messages)
    same = True
    for dom in (False, True):
        glue = Glue(Reference(), dom=dom)
        fast_out = []
        for i in range(0, len(messages), 500):
            fast_out += glue.run(messages[i : i + 500])
        same = same and ref_out == fast_out
        print(f"captured ({'serde_json DOM' if dom else 'direct scan'}): {len(ref_out)} events, "
              f"compiled == reference: {ref_out == fast_out}, fallbacks {glue.fallbacks}")
    bad = 0
    prefix = [m for m in messages if m[25] in b"RB"][:2]  # Relation, Begin
    template = next(m for m in messages if m[25] == ord("I"))
    edge = 0
    compiled = 0
    valid = EDGE_PAYLOADS[0]
    for version in (b"1", b"2"):
        for headers in (None, b'{"a": "b", "id": "x", "cdc_z": "q", "n": null}', b'{"a": 1}', b'[]'):
            for dom in (False, True):
                g = Glue(Reference(), dom=dom)
                g.run(prefix + [with_payload(template, valid, version, None)])  # the route is learned
                for p in EDGE_PAYLOADS:
                    msgs = prefix + [with_payload(template, p, version, headers)]
                    r = outcome(Reference().run, msgs)
                    before = g.fallbacks
                    f = outcome(lambda m: g.run(m), msgs)
                    compiled += g.fallbacks == before
                    edge += 1
                    if r != f:
                        bad += 1
                        print("MISMATCH", dom, version, headers, p, r, f)
    print(f"edge cases: {edge} (of which {compiled} taken by the compiled path, the rest fell back), mismatches {bad}")
    return 0 if same and not bad else 1


if __name__ == "__main__":
    sys.exit(main())

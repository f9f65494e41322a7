"""CPU per event of each stage, Python reference beside the compiled prototype, on the same captured input.

    .venv/bin/python -m prototypes.compiled_loop.bench [--repeat 5]

CPU time is time.process_time (all threads of this process); each figure is the best of --repeat passes
over the whole input (20 000 events), in batches of 500 messages as ReplicationSource.read() hands them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cdc.stream.pgoutput import decode_insert_tuple
from cdc.stream.route import parse_headers
from prototypes.compiled_loop.fastpath import Glue
from prototypes.compiled_loop.reference import Reference, load_inputs

HERE = Path(__file__).parent


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    messages = load_inputs(HERE / "inputs.bin")
    batches = [messages[i : i + 500] for i in range(0, len(messages), 500)]
    ref = Reference()
    events = ref.run(messages)  # warm: encoders compiled, routes cached
    n = len(events)
    inserts = [m for m in messages if m[25] == 0x49]
    values = [decode_insert_tuple(m, offset=25)[1] for m in inserts]
    router = ref.router
    fields = [router.row_fields(v) for v in values]
    routes = ref.routes
    lsn, xid = ref.txn_lsn, ref.txn_xid

    def s_decode():
        for m in inserts:
            decode_insert_tuple(m, offset=25)

    def s_fields():
        row_fields = router.row_fields
        for v in values:
            row_fields(v)

    def s_route_encode():
        get = routes.get
        for f in fields:
            _, encode = get((f[1], f[3], f[4]))
            encode(f[5])

    def s_headers():
        for f in fields:
            h = [("id", f[0]), ("event_type", f[3]), ("schema_version", f[4]), ("aggregate_type", f[1]),
                 ("commit_lsn", lsn), ("xid", xid)]
            if f[6] is not None:
                h.extend(parse_headers(f[6]))

    def s_reference():
        r = ref.run
        for b in batches:
            r(b)

    glue = Glue(Reference())
    for b in batches:
        glue.run(b)  # routes learned
    fp = glue.fp

    def s_rust_raw():
        for b in batches:
            start = 0
            while start < len(b):
                _, start = fp.process(b, start)

    def s_rust_glue():
        for b in batches:
            glue.run(b)

    def s_rust_encode_only():
        for b in batches:
            fp.encode_only(b)

    def s_rust_encode_only_dom():
        fp.dom = True
        for b in batches:
            fp.encode_only(b)
        fp.dom = False

    def s_rust_parse_only():
        for b in batches:
            fp.parse_only(b)

    results = {}
    for name, fn in [
        ("py: decode_insert_tuple", s_decode),
        ("py: row_fields", s_fields),
        ("py: route lookup + Avro encode", s_route_encode),
        ("py: headers list (+parse_headers)", s_headers),
        ("py: whole reference path", s_reference),
        ("rust: JSON parse only (serde_json DOM)", s_rust_parse_only),
        ("rust: decode+route+encode (serde DOM)", s_rust_encode_only_dom),
        ("rust: decode+route+encode (direct scan)", s_rust_encode_only),
        ("rust: process() (objects out)", s_rust_raw),
        ("rust: process() + glue", s_rust_glue),
    ]:
        results[name] = best(fn, args.repeat)
    for name, sec in results.items():
        print(f"{name:40s} {sec / n * 1e6:6.2f} µs/event")
    print(f"({n} events, best of {args.repeat}, process_time)")


if __name__ == "__main__":
    main()

"""End-to-end benchmark of outbox CDC: `make bench` (`python -m tests.bench.run`).

Modules: ``run`` (command line, phases), ``report`` (the throughput table, the summary, the verdicts),
``db`` (the bench database, its slots and the data generator), ``procs`` (the pipeline subprocess, RSS/CPU
sampling), ``bare_reader`` (the ceiling: a minimal pgoutput reader, run in a process of its own),
``measure`` (one drain of a pre-filled slot measured from the outside: arrivals, CPU, VmHWM, every event id
counted; shared with `make bench-debezium`), ``table`` (its figures and the table of relays), ``load`` (bulk
and paced inserts), ``latency`` (the Kafka consumer measuring latency), ``profiles`` (summaries of cProfile /
py-spy output), ``soak`` (`make soak`: half an hour of load through `cdc run` and the idempotent consumer).
None of them is collected by pytest.
"""

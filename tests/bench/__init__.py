"""End-to-end benchmark of outbox CDC: `make bench` (`python -m tests.bench.run`).

Modules: ``run`` (command line, phases, report), ``db`` (the bench database, its slots and the data
generator), ``procs`` (the pipeline subprocess, RSS/CPU sampling), ``bare_reader`` (the ceiling: a minimal
pgoutput reader), ``load`` (bulk and paced inserts), ``latency`` (the Kafka consumer measuring latency),
``profiles`` (summaries of cProfile / py-spy output). None of them is collected by pytest.
"""

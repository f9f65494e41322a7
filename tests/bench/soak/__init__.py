"""`make soak`: `cdc run` and an idempotent consumer under a steady offered load for a long time; does
anything grow, does the latency tail stay down, is anything missing at the end?

    . .stack/env && python -m tests.bench.soak --minutes 30 --rate 20000     # the defaults

Set-up, like `make bench-audit`: a database of its own (``soak_<run>``, dropped at the end) with the payload
table and the generator (below), `cdc setup` with a slot and publication of its own, its own topics
(``soak.<run>.order``, 6 partitions, kept for the run plus 10 minutes; deleted at the end). Then, all as
subprocesses: `cdc run`, and ``examples.invoice_service`` (an IdempotentConsumer writing one invoice per
OrderPlaced, its processed_events in the same database; its per-event INFO line turned off, which would write
gigabytes at this rate); a load generator (a process of its own, so that its clock shares no GIL with the
sampling) and a latency consumer (a thread here).

The load: ``--rate`` OrderPlaced events/s for ``--minutes``, offered on a monotonic schedule (open loop: a
late transaction goes at once; each is due when the events before it are; none starts after the end, and what
was due but not sent by then counts as not offered) over ``--loader-connections`` connections, in transactions
of mixed sizes (1, 10, 50, 200 and 1000 rows: 30, 30, 25, 12 and 3 % of the transactions, 70 rows on average,
so that 43 % of the events come in transactions of 1000 and 34 % in those of 200). Payloads (jsonb, built once
in SQL): 95 % small (~300 B, OrderPlaced v1, one in ten of them v2 with a short coupon), 5 % ~4 KB and 0.05 %
~100 KB (v2, the size in the coupon, the one free-form field of the schema; its text compresses about 4x, as
JSON does). The invoice service reads them as v1. Event ids are ``md5('soak-event-' || g)::uuid`` for a
sequence number g, so that the final check needs no outbox row: ``cdc outbox prune --older-than 2m`` runs
every minute, as in production, which keeps the table (and the disk) small and gives autovacuum its work.

Sampled every ``--sample-seconds`` (2): RSS, open file descriptors, threads and CPU of `cdc run` and of the
consumer (/proc); CPU of the walsender, of all PostgreSQL (the postmaster and its children, other databases'
too), of the broker, of the load generator and of this process, and of the machine: what limits the rate;
the slot's lag, ``pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)``; the topic's
end offsets and the consumer group's committed offsets (published, consumed, the consumer's lag); the
checkpointer's counters (pg_stat_bgwriter, pg_stat_checkpointer from PostgreSQL 17 on) and vacuums
(pg_stat_progress_vacuum, any database of the server; autovacuum_count + vacuum_count of the soak database's
tables); free disk space where PostgreSQL keeps its data.

Latency, commit-to-consume: a Kafka consumer in this process reads the event topic from its start; for each
record, the time poll() handed it over (the batch it came in: one time for all) minus the record's timestamp,
which `cdc run` sets to the transaction's commit time (ms, truncated). Both are this machine's wall clock
(time.time() here, the commit timestamp of PostgreSQL on the same machine). Counted per minute of receipt, in
1 ms buckets (the memory does not grow with the run), p50 and p99 per minute. It is an upper bound of
commit-to-ack: it also holds the fetch, and any wait of this process.

A checkpoint "ran in" a minute when one started in it (the counter of timed + requested checkpoints moved)
or completed in it (its write + sync time was added); a vacuum when one was seen running at a sample of the
minute, or one of the soak database's tables counted a vacuum that ended in it. Note: at high rates WAL fills
max_wal_size and checkpoints follow each other, so that nearly every minute has one.

At the end: the load stops, a last one-row transaction is committed; the slot must confirm it, then the
consumer group's committed offsets reach the topic's end offsets (each wait gives up after 60 s without
progress, or ``--drain-timeout``); then every generated id must be in processed_events, and the invoices
count must equal the events (one effect each).

It FAILS (exit 1) on:

- growth beyond noise: the median over the first 5 minutes against the last 5 (the first and last third of a
  run shorter than 10 minutes) of each process's RSS (more than max(10 MB, 10 %)), fds and threads (more
  than 2);
- a minute whose commit-to-consume p99 is over 100 ms with neither a checkpoint nor a vacuum in it, or in
  which no record arrived;
- not keeping up: the load generator more than 5 s of load behind its schedule at any time (the rate was not
  offered), or `cdc run` (events committed but not in the topic) or the consumer (in the topic, not committed)
  more than 5 s of load behind when the load ends, or not drained in time;
- any event missing at the end, or a second invoice for one, a dead letter, or a process that exited; the
  load stopped early because PostgreSQL's disk had less than 10 GB free.

Output: one line per minute, then ``soak: result=PASS|FAIL ...`` and a line per failure; JSON of every sample
and a plot (RSS and p99 over time) in ``bench-results/soak-<date>.{json,png}``, the processes' logs beside
them. ``--inject missing`` (deletes 5 processed_events rows before the check) and ``--inject growth`` (adds
50 MB to `cdc run`'s RSS samples of the last window) show that the judgement catches what it should.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# The package's modules, in the order of the data flow: load (the offered transactions), pipeline (the
# database, topics and processes under test), sampling (every 2 s, and per minute), judgement (the
# failures and the result line), output (JSON and the plot), orchestration (the run from set-up to
# drain), __main__ (the command line). What they all share is here, so that none imports another
# sideways for it: no cycles.

ROOT = Path(__file__).resolve().parents[3]
PARTITIONS = 6
WARM_UP_ROWS = 100
STALL_S = 60.0  # a wait at the end gives up after this long without progress
LOW_DISK_BYTES = 10 * 2**30  # the load stops when PostgreSQL's disk has less free (a shared machine)


class SoakError(Exception):
    pass


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

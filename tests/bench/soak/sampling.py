"""What the soak measures: commit-to-consume per minute (a latency consumer), the server's side (slot lag,
checkpoints, vacuums, free disk), the processes' RSS, fds, threads and CPU every sample, and the figures and
line of each minute."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from tests.bench.db import connect
from tests.bench.latency import latency_consumer_config
from tests.bench.procs import MachineCpu, cpu_seconds, open_fds, rss_mb, threads, tree_cpu_seconds
from tests.bench.soak import WARM_UP_ROWS


def stack_kafka_pid() -> int | None:
    """The broker's pid from the pid file of the stack that .stack/env describes (a worktree has none)."""
    socket_dir = os.environ.get("CDC_STACK_PG_SOCKET_DIR")
    if not socket_dir:
        return None
    try:
        return int((Path(socket_dir).parent / "kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


class LatencyHistograms(threading.Thread):
    """Reads ``topic`` from its start; for each record, receive time minus record timestamp (commit time), in
    1 ms buckets per minute of receipt since ``origin`` (wall clock; minute -1 before it is set)."""

    def __init__(self, bootstrap: str, topic: str, group_id: str) -> None:
        super().__init__(name="latency-consumer", daemon=True)
        self.topic = topic
        self.config = latency_consumer_config(bootstrap, group_id)
        self.origin: float | None = None
        self.minutes: dict[int, dict[int, int]] = {}
        self.count = 0
        self.errors: list[str] = []
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self._stop_event = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.config)
        try:
            metadata = consumer.list_topics(self.topic, timeout=10)
            partitions = sorted(metadata.topics[self.topic].partitions)
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            self.ready.set()
            while not self._stop_event.is_set():
                first = consumer.poll(0.1)
                if first is None:
                    continue
                now = time.time()
                now_ms = now * 1000
                batch = [first, *consumer.consume(num_messages=1000, timeout=0)]
                minute = -1 if self.origin is None else int((now - self.origin) // 60)
                with self.lock:
                    buckets = self.minutes.setdefault(minute, {})
                    for message in batch:
                        if message.error() is not None:
                            if len(self.errors) < 100:
                                self.errors.append(message.error().str())
                            continue
                        latency = int(now_ms - message.timestamp()[1])
                        buckets[latency] = buckets.get(latency, 0) + 1
                        self.count += 1
        except KafkaException as exc:
            self.errors.append(str(exc))
        finally:
            self.ready.set()
            consumer.close()

    def minute(self, index: int) -> dict[str, Any]:
        with self.lock:
            buckets = dict(self.minutes.get(index, {}))
        return histogram_figures(buckets)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(15)


def histogram_figures(buckets: dict[int, int]) -> dict[str, Any]:
    """count, p50, p99 and max (ms) of a {latency ms: count} histogram."""
    total = sum(buckets.values())
    if not total:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    keys = sorted(buckets)
    wanted = {"p50_ms": 0.50, "p99_ms": 0.99}
    out: dict[str, Any] = {"count": total, "max_ms": keys[-1]}
    seen = 0
    for key in keys:
        seen += buckets[key]
        for name, p in list(wanted.items()):
            if seen > total * p or seen == total:
                out[name] = key
                del wanted[name]
        if not wanted:
            break
    return out


# -- the server's side -----------------------------------------------------------------------------------


class ServerStats:
    """The slot's lag, checkpoints, vacuums and free disk, over one connection to the soak database."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.conn = connect(dsn)
        self.slot = slot
        self.version = self.conn.info.server_version
        (self.database,) = self.conn.execute("SELECT current_database()").fetchone()  # type: ignore[misc]
        (data_directory,) = self.conn.execute("SHOW data_directory").fetchone()  # type: ignore[misc]
        self.data_directory = data_directory if os.path.isdir(data_directory) else "/"
        try:  # the postmaster: all PostgreSQL spends is its and its children's
            self.postmaster: int | None = int(Path(data_directory, "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            self.postmaster = None

    def checkpoints(self) -> tuple[int, float]:
        """(checkpoints started: timed + requested, ms spent writing + syncing by the completed ones)."""
        if self.version >= 170000:
            query = "SELECT num_timed + num_requested, write_time + sync_time FROM pg_stat_checkpointer"
        else:
            query = (
                "SELECT checkpoints_timed + checkpoints_req, checkpoint_write_time + checkpoint_sync_time "
                "FROM pg_stat_bgwriter"
            )
        row = self.conn.execute(query).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])

    def sample(self) -> dict[str, Any]:
        slot = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active_pid "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        started, ckpt_ms = self.checkpoints()
        running = self.conn.execute(
            "SELECT pid, datname, relid::regclass::text, phase FROM pg_stat_progress_vacuum"
        ).fetchall()
        counts = self.conn.execute(
            "SELECT relid::regclass::text, autovacuum_count + vacuum_count FROM pg_stat_user_tables"
        ).fetchall()
        disk = os.statvfs(self.data_directory)
        return {
            "slot_lag_bytes": int(slot[0]) if slot and slot[0] is not None else None,
            "walsender_pid": slot[1] if slot else None,
            "checkpoints_started": started,
            "checkpoint_write_sync_ms": ckpt_ms,
            "vacuums_running": [
                {"pid": pid, "database": db, "table": table, "phase": phase}
                for pid, db, table, phase in running
            ],
            "vacuum_counts": {table: int(n) for table, n in counts},
            "disk_free_bytes": disk.f_bavail * disk.f_frsize,
        }

    def close(self) -> None:
        self.conn.close()


class Sampling:
    """A sample and a minute's figures (a base of Soak: its children, server, latency, loader and samples
    are set by Soak)."""

    def snapshot(self, t0: float, loaded: dict[str, Any], kafka: int | None) -> dict[str, Any]:
        assert self.server is not None and self.latency is not None
        server = self.server.sample()
        sample: dict[str, Any] = {"t": round(time.monotonic() - t0, 2)}
        for child in self.children:
            sample[f"rss_{child.name}_mb"] = rss_mb(child.pid)
            sample[f"fds_{child.name}"] = open_fds(child.pid)
            sample[f"threads_{child.name}"] = threads(child.pid)
            sample[f"cpu_{child.name}_s"] = cpu_seconds(child.pid)
        sample["cpu_walsender_s"] = cpu_seconds(server["walsender_pid"])
        sample["cpu_kafka_s"] = cpu_seconds(kafka)
        sample["cpu_postgres_s"] = tree_cpu_seconds(self.server.postmaster)
        sample["cpu_loader_s"] = cpu_seconds(self.loader.pid if self.loader is not None else None)
        sample["cpu_soak_s"] = cpu_seconds(os.getpid())
        sample["loadavg_1m"] = os.getloadavg()[0]
        sample["committed"] = loaded.get("committed", 0)
        sample["loader_behind"] = loaded.get("behind", 0)
        sample["loader_commit_ms_max"] = loaded.get("commit_ms_max")
        sample["published"] = self.published() - WARM_UP_ROWS
        sample["consumed"] = self.consumed() - WARM_UP_ROWS
        sample["received"] = self.latency.count - WARM_UP_ROWS
        sample.update(server)
        return sample

    def close_minute(
        self, index: int, start: dict[str, Any], end: dict[str, Any], machine: MachineCpu
    ) -> dict[str, Any]:
        assert self.latency is not None
        seconds = max(1e-3, end["t"] - start["t"])
        inside = [s for s in self.samples if start["t"] < s["t"] <= end["t"]]

        def rate(key: str) -> int:
            return round((end[key] - start[key]) / seconds)

        def median(key: str) -> float | None:
            values = [s[key] for s in inside if s.get(key) is not None]
            return round(statistics.median(values), 1) if values else None

        def cores(key: str) -> float | None:
            if start.get(key) is None or end.get(key) is None:
                return None
            return round((end[key] - start[key]) / seconds, 2)

        running = {(v["pid"], v["database"], v["table"]) for s in inside for v in s["vacuums_running"]}
        ended = {
            table
            for table, n in end["vacuum_counts"].items()
            if n > start["vacuum_counts"].get(table, 0)
            and not any(db == self.database and t == table for _, db, t in running)
        }
        latency = self.latency.minute(index)
        figures = {
            "minute": index + 1,
            "seconds": round(seconds, 1),
            "offered_per_s": rate("committed"),
            "published_per_s": rate("published"),
            "consumed_per_s": rate("consumed"),
            "received": latency["count"],
            "p50_ms": latency["p50_ms"],
            "p99_ms": latency["p99_ms"],
            "max_ms": latency["max_ms"],
            "rss_run_mb": median("rss_run_mb"),
            "rss_consumer_mb": median("rss_consumer_mb"),
            "fds_run": median("fds_run"),
            "fds_consumer": median("fds_consumer"),
            "threads_run": median("threads_run"),
            "threads_consumer": median("threads_consumer"),
            "cores_run": cores("cpu_run_s"),
            "cores_consumer": cores("cpu_consumer_s"),
            "cores_walsender": cores("cpu_walsender_s"),
            "cores_kafka": cores("cpu_kafka_s"),
            "cores_postgres": cores("cpu_postgres_s"),  # every PostgreSQL process: the walsender too
            "cores_loader": cores("cpu_loader_s"),
            "cores_soak": cores("cpu_soak_s"),
            **{f"machine_{k}": v for k, v in machine.read().items()},
            "slot_lag_mb": max((s["slot_lag_bytes"] or 0 for s in inside), default=0) / 2**20,
            "pipeline_lag": end["committed"] - end["published"],
            "consumer_lag": end["published"] - end["consumed"],
            "loader_behind": end["loader_behind"],
            "loader_commit_ms_max": max((s["loader_commit_ms_max"] or 0 for s in inside), default=None),
            "checkpoints_started": end["checkpoints_started"] - start["checkpoints_started"],
            "checkpoints_completed": sum(
                1
                for a, b in zip([start, *inside], inside, strict=False)
                if b["checkpoint_write_sync_ms"] > a["checkpoint_write_sync_ms"]
            ),
            "vacuums": sorted(f"{db}:{table}" for _, db, table in running)
            + sorted(f"{self.database}:{t} (ended)" for t in ended),
            "disk_free_gb": round(end["disk_free_bytes"] / 2**30, 1),
        }
        figures["checkpoint"] = figures["checkpoints_started"] + figures["checkpoints_completed"]
        figures["vacuum"] = len(figures["vacuums"])
        figures["slot_lag_mb"] = round(figures["slot_lag_mb"], 1)
        return figures

    @staticmethod
    def minute_line(m: dict[str, Any]) -> str:
        return (
            f"soak: minute={m['minute']} offered={m['offered_per_s']}/s published={m['published_per_s']}/s "
            f"consumed={m['consumed_per_s']}/s p50_ms={m['p50_ms']} p99_ms={m['p99_ms']} "
            f"rss_run_mb={m['rss_run_mb']} rss_consumer_mb={m['rss_consumer_mb']} fds_run={_g(m['fds_run'])} "
            f"fds_consumer={_g(m['fds_consumer'])} threads_run={_g(m['threads_run'])} "
            f"threads_consumer={_g(m['threads_consumer'])} slot_lag_mb={m['slot_lag_mb']} "
            f"consumer_lag={m['consumer_lag']} cores_run={m['cores_run']} "
            f"cores_consumer={m['cores_consumer']} cores_postgres={m['cores_postgres']} "
            f"cores_kafka={m['cores_kafka']} "
            f"machine_cores={m.get('machine_busy_cores')} checkpoint={m['checkpoint']} vacuum={m['vacuum']}"
        )

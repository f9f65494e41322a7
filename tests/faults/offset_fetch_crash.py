"""Reproduction of the crash of issue 45: librdkafka's ListConsumerGroupOffsets against a broker that has just
started dereferences a NULL consumer group in librdkafka's own thread (SIGSEGV, "segfault at 58" in rdk:main).

    python -m tests.faults.offset_fetch_crash --runs 5                      # a fresh broker per run
    python -m tests.faults.offset_fetch_crash --client 127.0.0.1:9092 30    # only the client, 30 s

Each run starts a broker on new storage (tests/faults/fresh_broker.py's, ports 31092/31093 by default) and, as
soon as its port opens, a client process that asks an AdminClient for the committed offsets of a new group
every 50 ms (``AdminClient.list_consumer_group_offsets``). While the new cluster creates and loads
``__consumer_offsets``, the broker answers the OffsetFetch with NOT_COORDINATOR; librdkafka's
``rd_kafka_handle_OffsetFetch`` then asks the client's consumer group to look its coordinator up again,
``rd_kafka_cgrp_op(rk->rk_cgrp, ...)``, and an admin client has none (NULL): the process dies with SIGSEGV
(exit -11), without a Python stack, since librdkafka's threads block every signal and the kernel kills the
process without running faulthandler's handler. librdkafka issue 5040 (open); seen with confluent-kafka 2.16.2
and librdkafka 2.16.0, the newest releases.

Measured here: 6 of 10 runs crashed, each on its first requests (gdb: rd_kafka_cgrp_op <-
rd_kafka_handle_OffsetFetch <- rd_kafka_ListConsumerGroupOffsetsResponse_parse <- rd_kafka_admin_worker,
thread rdk:main). The project reads committed offsets with a Consumer of the group instead (cdc.stream.admin);
``--consumer`` runs the same loop that way: 0 of 5 runs crashed.

Exit status: 1 when a run crashed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import confluent_kafka
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.children import dying_with_parent


def admin_committed(
    admin: AdminClient, group: str, partitions: list[TopicPartition] | None = None
) -> list[int]:
    """The call that crashes: a group's committed offsets through the admin API."""
    request = ConsumerGroupTopicPartitions(group, partitions)
    answer = admin.list_consumer_group_offsets([request], request_timeout=10)[group].result(timeout=15)
    return [tp.offset for tp in answer.topic_partitions]


def client(bootstrap: str, seconds: float, *, consumer: bool) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline, n, errors = time.monotonic() + seconds, 0, dict[str, int]()
    while time.monotonic() < deadline:
        n += 1
        group = f"offset-fetch-crash-{n}"
        try:
            if consumer:
                reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
                try:
                    reader.committed([TopicPartition("no-such-topic", 0)], timeout=15)
                finally:
                    reader.close()
            else:
                admin_committed(admin, group)
        except KafkaException as exc:
            errors[exc.args[0].name()] = errors.get(exc.args[0].name(), 0) + 1
        time.sleep(0.05)
    print(f"{n} requests, no crash; errors: {errors}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=20.0, help="of requests per run (default 20)")
    p.add_argument("--port", type=int, default=31092)
    p.add_argument("--controller-port", type=int, default=31093)
    p.add_argument("--consumer", action="store_true", help="ask with Consumer.committed instead")
    p.add_argument("--client", nargs=2, metavar=("BOOTSTRAP", "SECONDS"), help="only the client")
    args = p.parse_args()
    if args.client:
        return client(args.client[0], float(args.client[1]), consumer=args.consumer)
    from tests.faults.fresh_broker import Broker

    print(f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}")
    crashed = 0
    for run in range(1, args.runs + 1):
        broker = Broker(args.port, args.controller_port, "512m")
        try:
            broker.format()
            broker.spawn()
            broker.wait("port")
            command = [sys.executable, "-m", "tests.faults.offset_fetch_crash", "--client", broker.bootstrap]
            command += [str(args.seconds), *(["--consumer"] if args.consumer else [])]
            done = subprocess.run(dying_with_parent(command), capture_output=True, text=True)
        finally:
            broker.kill()
            broker.remove()
        crashed += done.returncode < 0
        what = f"killed by signal {-done.returncode}" if done.returncode < 0 else done.stdout.strip()
        print(f"run {run}: {what}", flush=True)
    print(f"offset-fetch-crash: {crashed} of {args.runs} runs crashed")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`cdc outbox prune` against the real table, with the pipeline streaming: deletes are never events."""

from __future__ import annotations

from psycopg import sql

from tests.plugins.pipeline import cdc, topic_size, wait_until


def test_prune_deletes_old_rows_in_batches_and_publishes_nothing(outbox, pipeline_process, kafka_bootstrap):
    proc = pipeline_process()
    proc.wait_streaming()
    old = outbox.commit([outbox.event(f"p-{i}") for i in range(23)])
    new = outbox.commit([outbox.event(f"p-{i}") for i in range(5)])
    table = sql.Identifier(outbox.table)
    outbox.conn.execute(
        sql.SQL("UPDATE {} SET created_at = now() - interval '3 days' WHERE id = ANY(%s::uuid[])").format(
            table
        ),
        (old.ids,),
    )
    topic = outbox.topic("order")
    wait_until(lambda: topic_size(kafka_bootstrap, topic) >= 28, 30, "the 28 events published")

    done = cdc(outbox.env, "outbox", "prune", "--older-than", "2d", "--batch-size", "7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted 23 rows older than 2d from public.{outbox.table}"
    left = outbox.conn.execute(sql.SQL("SELECT id::text FROM {} ORDER BY id").format(table)).fetchall()
    assert sorted(r[0] for r in left) == sorted(new.ids)

    # Neither the deletes nor the update above became events, and the stream goes on.
    after = outbox.commit([outbox.event("p-after")])
    wait_until(lambda: outbox.confirmed_lsn() >= after.lsn_after, 30, "the last event confirmed")
    assert topic_size(kafka_bootstrap, topic) == 29
    assert topic_size(kafka_bootstrap, outbox.dlq_topic) == 0
    assert proc.terminate() == 0

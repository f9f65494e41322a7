-- The publication: inserts of the outbox table only. Updates, deletes and truncates (pruning!) are not
-- published, so retention never produces change events. A partitioned outbox (README, "Keeping the outbox
-- small") is published through its root (publish_via_partition_root): its inserts arrive under the outbox's
-- name, whichever partition holds them, and a partition added or dropped later changes nothing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{publication_literal}}) THEN
        CREATE PUBLICATION {{publication}} FOR TABLE {{table}}
            WITH (publish = 'insert', publish_via_partition_root = true);
    ELSIF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass({{table_literal}}) AND relkind = 'p')
        AND NOT (SELECT pubviaroot FROM pg_publication WHERE pubname = {{publication_literal}}) THEN
        ALTER PUBLICATION {{publication}} SET (publish_via_partition_root = true);
    END IF;
END
$$;

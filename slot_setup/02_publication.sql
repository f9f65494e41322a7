-- The publication: inserts of the outbox table only. Updates, deletes and truncates (pruning!) are not
-- published, so retention never produces change events.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {{publication_literal}}) THEN
        CREATE PUBLICATION {{publication}} FOR TABLE {{table}} WITH (publish = 'insert');
    END IF;
END
$$;

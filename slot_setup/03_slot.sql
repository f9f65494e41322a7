-- The logical replication slot with the pgoutput plugin. Created once; the pipeline never re-creates it
-- (a new slot starts at the current WAL position and would skip what the old one had not confirmed).
SELECT pg_create_logical_replication_slot({{slot_literal}}, 'pgoutput')
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = {{slot_literal}});

-- The logical replication slot with the pgoutput plugin. Created once; the pipeline never re-creates it
-- (a new slot starts at the current WAL position and would skip what the old one had not confirmed).
-- With `cdc setup --failover` (PostgreSQL 17+) the slot is created with failover = true, so that it is
-- synchronized to standbys and survives a failover (the arguments are: temporary, two-phase, failover).
SELECT pg_create_logical_replication_slot({{slot_literal}}, 'pgoutput'{{failover_arguments}})
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = {{slot_literal}});

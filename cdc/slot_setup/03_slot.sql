-- The logical replication slot with the pgoutput plugin. Created once; the pipeline never re-creates it
-- (a new slot starts at the current WAL position and would skip what the old one had not confirmed).
-- With `cdc setup --failover` (PostgreSQL 17+) the slot is created with failover = true, so that it is
-- synchronized to standbys and survives a failover (the arguments are: temporary, two-phase, failover).
-- The point it was created at is kept for this session: 06_checkpoint.sql saves it as the slot's identity.
SELECT set_config(
    'cdc.slot_created_lsn',
    (pg_create_logical_replication_slot({{slot_literal}}, 'pgoutput'{{failover_arguments}})).lsn::text,
    false
)
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = {{slot_literal}});

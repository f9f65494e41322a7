-- Where `cdc run` notes how far Kafka has acknowledged the outbox (one row per slot): the slot's confirmed
-- position and the commit time of the last outbox transaction before it, written at most every
-- status_interval, never per event. When the slot is lost, `cdc recover` republishes the outbox rows
-- committed since that time (minus a margin) and re-creates the slot. `recovering_since` is set while a
-- recover runs: `cdc run` refuses to start on a slot whose recover did not finish.
-- Not in the publication: writing it produces no events.
CREATE TABLE IF NOT EXISTS {{checkpoint_table}} (
    slot             text        PRIMARY KEY,
    confirmed_lsn    pg_lsn      NULL,
    commit_time      timestamptz NULL,
    updated_at       timestamptz NOT NULL,
    recovering_since timestamptz NULL
);
-- The slot's identity: where and when it was created (by 03_slot.sql in this session, or by `cdc recover`).
-- Nothing committed before it is the slot's to deliver; the exactly-once checkpoint in Kafka is keyed by it,
-- so that a checkpoint of another slot of the same name is never taken for this one's. `pruned_until` is the
-- newest commit (or creation) time of a row that `cdc outbox prune` deleted: `cdc recover` needs no row
-- before it. `partitioner` is what the slot's events are published with (`cdc run` refuses to change it
-- unnoticed). Added to a table of an older setup; a row with only these is a slot that has acknowledged
-- nothing yet.
ALTER TABLE {{checkpoint_table}}
    ALTER COLUMN confirmed_lsn DROP NOT NULL,
    ALTER COLUMN commit_time DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS slot_created_lsn pg_lsn NULL,
    ADD COLUMN IF NOT EXISTS slot_created_at timestamptz NULL,
    ADD COLUMN IF NOT EXISTS pruned_until timestamptz NULL,
    ADD COLUMN IF NOT EXISTS partitioner text NULL,
    -- `cdc audit`: every row created before this was audited and found published or dead-lettered, which
    -- `cdc outbox prune --audited` requires of the rows it deletes...
    ADD COLUMN IF NOT EXISTS audited_until timestamptz NULL,
    -- ...when written by a transaction older than this: the oldest one still running when that audit looked
    -- (the others, open then, are judged by the next audit: cdc/ops/audit_mark.py).
    ADD COLUMN IF NOT EXISTS audited_xmin xid8 NULL;
INSERT INTO {{checkpoint_table}} AS c (slot, slot_created_lsn, slot_created_at, updated_at)
SELECT {{slot_literal}}, created.lsn::pg_lsn, now(), now()
FROM (SELECT nullif(current_setting('cdc.slot_created_lsn', true), '') AS lsn) AS created
WHERE created.lsn IS NOT NULL
ON CONFLICT (slot) DO UPDATE
SET slot_created_lsn = excluded.slot_created_lsn, slot_created_at = excluded.slot_created_at, updated_at = now();

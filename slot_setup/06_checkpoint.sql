-- Where `cdc run` notes how far Kafka has acknowledged the outbox (one row per slot): the slot's confirmed
-- position and the commit time of the last outbox transaction before it, written at most every
-- status_interval, never per event. When the slot is lost, `cdc recover` republishes the outbox rows
-- created since that time (minus a margin) and re-creates the slot. `recovering_since` is set while a
-- recover runs: `cdc run` refuses to start on a slot whose recover did not finish.
-- Not in the publication: writing it produces no events.
CREATE TABLE IF NOT EXISTS {{checkpoint_table}} (
    slot             text        PRIMARY KEY,
    confirmed_lsn    pg_lsn      NOT NULL,
    commit_time      timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    recovering_since timestamptz NULL
);

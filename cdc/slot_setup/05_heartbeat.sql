-- Where `cdc run` notes the last heartbeat it read back from the stream (one row per slot), so that
-- `cdc status` can tell "the pipeline saw its own heartbeat at ..." without talking to the pipeline.
-- Not in the publication: writing it produces no events.
CREATE TABLE IF NOT EXISTS {{heartbeat_table}} (
    slot    text        PRIMARY KEY,
    seen_at timestamptz NOT NULL
);

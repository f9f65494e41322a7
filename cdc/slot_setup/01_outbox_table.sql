-- The outbox table (docs/design.md, "The outbox row"). Applications insert one row per event in the same
-- transaction as their business change; the pipeline reads the inserts from the WAL, so rows may be pruned
-- or the table truncated at any time after commit.
-- {{...}} markers are filled in by `cdc setup` with the configured (quoted) names; a line tagged
-- `-- when:<field>` is left out when the column map has no such column (the debezium preset).
CREATE TABLE IF NOT EXISTS {{table}} (
    {{col_id}}             uuid        PRIMARY KEY,
    {{col_aggregate_type}} text        NOT NULL,
    {{col_aggregate_id}}   text        NOT NULL,
    {{col_event_type}}     text        NOT NULL,
    {{col_schema_version}} int         NOT NULL DEFAULT 1, -- when:schema_version
    {{col_headers}}        jsonb       NULL, -- when:headers
    {{col_created_at}}     timestamptz NOT NULL DEFAULT now(), -- when:created_at
    {{col_payload}}        jsonb       NOT NULL
);

-- `cdc outbox prune` deletes old rows in batches by creation time.
CREATE INDEX IF NOT EXISTS {{index_created_at}} ON {{table}} ({{col_created_at}}); -- when:created_at

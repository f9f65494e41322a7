-- Producer-side helpers for applications that write events in SQL (in the same transaction as their change).
--   SELECT outbox_emit('order', 'o-1', 'OrderPlaced', '{"order_id": "o-1", ...}'::jsonb);
-- inserts an outbox row; outbox_emit_message(...) emits a transactional logical decoding message with the
-- prefix 'outbox' instead, which never touches the table (nothing to prune). Both return the event id.
-- The payload is validated against its Avro schema by the pipeline; the Python helper cdc.outbox.emit
-- validates before writing.
CREATE OR REPLACE FUNCTION {{function_emit}}(
    p_aggregate_type text,
    p_aggregate_id text,
    p_event_type text,
    p_payload jsonb,
    p_schema_version int DEFAULT 1, -- when:schema_version
    p_headers jsonb DEFAULT NULL, -- when:headers
    p_id uuid DEFAULT gen_random_uuid()
) RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO {{table}} (
        {{col_id}}, {{col_aggregate_type}}, {{col_aggregate_id}}, {{col_event_type}},
        {{col_schema_version}}, -- when:schema_version
        {{col_headers}}, -- when:headers
        {{col_payload}}
    ) VALUES (
        p_id, p_aggregate_type, p_aggregate_id, p_event_type,
        p_schema_version, -- when:schema_version
        p_headers, -- when:headers
        p_payload
    )
    RETURNING {{col_id}};
$$;

-- pgoutput carries logical messages from PostgreSQL 14 on; on 13 the walsender would read the message and
-- send nothing, so the event would be lost without a word: there the function refuses instead.
CREATE OR REPLACE FUNCTION {{function_emit_message}}(
    p_aggregate_type text,
    p_aggregate_id text,
    p_event_type text,
    p_payload jsonb,
    p_schema_version int DEFAULT 1,
    p_headers jsonb DEFAULT NULL,
    p_id uuid DEFAULT gen_random_uuid()
) RETURNS uuid LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('server_version_num')::int < 140000 THEN
        RAISE EXCEPTION 'outbox messages need PostgreSQL 14 or later: on % pgoutput cannot carry logical messages',
            current_setting('server_version')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'write the event as an outbox row with the _emit function beside this one';
    END IF;
    PERFORM pg_logical_emit_message(true, 'outbox', jsonb_build_object(
        'id', p_id, 'aggregate_type', p_aggregate_type, 'aggregate_id', p_aggregate_id,
        'event_type', p_event_type, 'schema_version', p_schema_version, 'payload', p_payload,
        'headers', p_headers)::text);
    RETURN p_id;
END
$$;

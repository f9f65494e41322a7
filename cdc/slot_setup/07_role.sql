-- requires: role
-- A least-privilege role for `cdc run` (only with `cdc setup --role NAME`). The grants below are exactly
-- what streaming, the heartbeat, the saved position and `cdc status` need, found by
-- tests/integration/ops/test_role.py; nothing else (no superuser, no ownership, no write access to the
-- outbox). Its password is not set here: set it yourself (ALTER ROLE ... PASSWORD) or use another
-- authentication method, so no secret passes through cdc.
-- REPLICATION is more than streaming this outbox, and PostgreSQL has nothing finer: with a slot of its own the
-- role can decode every change of every table of this database, and it can drop any slot of the cluster.
-- docs/operations.md ("Least privilege") says what a DBA can do about it.
-- On Amazon RDS and Aurora the REPLICATION attribute is not the administrator's to give: membership in their
-- rds_replication role is what lets a role stream there, and is granted instead.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {{role_literal}}) THEN
        CREATE ROLE {{role}} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
    ELSE
        ALTER ROLE {{role}} LOGIN;
    END IF;
    IF to_regrole('rds_replication') IS NOT NULL THEN
        GRANT rds_replication TO {{role}};
    ELSE
        ALTER ROLE {{role}} REPLICATION;
    END IF;
END
$$;
-- `cdc status` counts the outbox's rows and reads its oldest creation time.
GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT ON {{table}} TO {{role}};
-- `cdc run` notes the heartbeats it reads back; `cdc status` shows the last one.
GRANT SELECT, INSERT, UPDATE ON {{heartbeat_table}} TO {{role}};
-- `cdc run` notes how far Kafka acknowledged the outbox, for `cdc recover`; and reads whether a recover runs.
GRANT SELECT, INSERT, UPDATE ON {{checkpoint_table}} TO {{role}};

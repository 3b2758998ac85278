-- The least-privilege PostgreSQL grants of a runledger worker (a Prefect worker, `runledger
-- serve` or `runledger run`): what a tick and a delivery pass need, and nothing else. No DDL,
-- no DELETE, no TRUNCATE; the ledger's history (attempts, delivery attempts) is append-only
-- for a worker. A migration owner (the role that owns the tables) runs `runledger db upgrade`
-- and then this file, as that owner or a superuser, e.g.
--     psql "$OWNER_URL" -v ON_ERROR_STOP=1 -f infra/worker-grants.sql
-- or  python infra/apply_grants.py infra/worker-grants.sql   (RUNLEDGER_DATABASE_URL = the owner)
-- Run it again after an upgrade that adds a table. The role itself (LOGIN, its password) is
-- made once by whoever administers the server:
--     CREATE ROLE runledger_worker LOGIN PASSWORD '...';
-- A job's own business tables (created by `runledger db upgrade`) need what its `effect`
-- does, e.g. for daily-credit:  GRANT SELECT, INSERT ON credits TO runledger_worker;

DO $$ BEGIN
  EXECUTE 'GRANT CONNECT ON DATABASE ' || quote_ident(current_database()) || ' TO runledger_worker';
END $$;
GRANT USAGE ON SCHEMA public TO runledger_worker;

-- `runledger run` migrates first: at head that only reads the version.
GRANT SELECT ON alembic_version TO runledger_worker;

-- Runs: register (INSERT ... ON CONFLICT), claim, renew, save input, complete, fail, release.
GRANT SELECT, INSERT, UPDATE ON runs TO runledger_worker;
-- Attempts: one row per claim, finished by complete / fail / release / expiry.
GRANT SELECT, INSERT, UPDATE ON attempts TO runledger_worker;
-- Outbox: queued with the completion; claimed (FOR UPDATE SKIP LOCKED) and marked by delivery.
GRANT SELECT, INSERT, UPDATE ON outbox TO runledger_worker;
-- Delivery attempts: appended, never changed.
GRANT SELECT, INSERT ON delivery_attempts TO runledger_worker;
GRANT USAGE ON SEQUENCE delivery_attempts_id_seq TO runledger_worker;
-- Model calls: recorded before each call leaves (INSERT), its answer or failure after (UPDATE).
GRANT SELECT, INSERT, UPDATE ON model_calls TO runledger_worker;
-- Budget windows: a call reserves its estimate (INSERT ... ON CONFLICT), its answer settles it.
GRANT SELECT, INSERT, UPDATE ON budget_windows TO runledger_worker;
-- A tick counts what the duplicates it suppressed would have cost, per job and day (upserts).
GRANT SELECT, INSERT, UPDATE ON suppressed_counts TO runledger_worker;
GRANT SELECT, INSERT, UPDATE ON suppressed_costs TO runledger_worker;

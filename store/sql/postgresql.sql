-- The SQL runledger's ledger sends to postgresql, statement by statement.
-- Written by `python -m store.sql --write`; a test fails when it is stale.

-- name: read_clock
-- The database clock, which every lease and due time is judged by.
SELECT statement_timestamp() AS now;

-- name: find_run_ids
-- The first Run ids in the range a prefix spans, and how many there are.
-- parameters: low, high, param_1
SELECT runs.run_id AS id, count(*) OVER () AS matches 
FROM runs 
WHERE runs.run_id BETWEEN %s::VARCHAR AND %s::VARCHAR ORDER BY runs.run_id 
 LIMIT %s::INTEGER;

-- name: find_message_ids
-- The first outbox message ids in the range a prefix spans, and how many there are.
-- parameters: low, high, param_1
SELECT outbox.message_id AS id, count(*) OVER () AS matches 
FROM outbox 
WHERE outbox.message_id BETWEEN %s::VARCHAR AND %s::VARCHAR ORDER BY outbox.message_id 
 LIMIT %s::INTEGER;

-- name: get_run
-- A Run by id.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id = %s::VARCHAR;

-- name: register_run
-- Insert the Run as pending, once per identity: an existing Run is left as it is (its parameters
-- are compared by the caller).
-- parameters: run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, attempts
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, attempts, created_at, updated_at) VALUES (%s::VARCHAR, %s::VARCHAR, %s::VARCHAR, %s::TIMESTAMP WITH TIME ZONE, %s::VARCHAR, %s::VARCHAR, %s::JSONB, %s::VARCHAR, %s::INTEGER, %s::INTEGER, statement_timestamp(), statement_timestamp()) ON CONFLICT DO NOTHING RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: claim_run
-- Take the lease of an unfinished Run whose lease is free, expired (database clock) or ours: bump
-- the fence, count the attempt (PostgreSQL: and end the previous holder's Attempt and open this
-- one's in the same statement).
-- parameters: param_2, fence_1, owner, lease, attempts_1, run_id, status_1, status_2, owner, param_1, attempt_id, owner
WITH taken AS 
(UPDATE runs SET status=%s::VARCHAR, fence=(runs.fence + %s::INTEGER), owner=%s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %s)), attempts=(runs.attempts + %s::INTEGER), updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = %s::VARCHAR) RETURNING runs.run_id, runs.fence, runs.lease_expires_at), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome=%s::VARCHAR FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT %s::VARCHAR AS anon_1, taken.run_id AS run_id, %s::VARCHAR AS anon_2, taken.fence AS fence, statement_timestamp() AS db_now_1 
FROM taken)
 SELECT taken.run_id, taken.fence, taken.lease_expires_at 
FROM taken;

-- name: enter_run
-- Register and claim one Run, given as one JSON object, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: param_2, param_3, owner, param_4, lease, runs, param_5, fence_1, attempts_1, status_1, status_2, param_1, runs
WITH taken AS 
(INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, %s::VARCHAR AS anon_1, %s::INTEGER AS anon_2, %s::VARCHAR AS anon_3, %s::INTEGER AS anon_4, (statement_timestamp() + make_interval(secs => %s)) AS db_now_1, statement_timestamp() AS db_now_2, statement_timestamp() AS db_now__1 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_record(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given 
WHERE true ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = %s::VARCHAR, fence = (runs.fence + %s::INTEGER), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + %s::INTEGER), updated_at = excluded.updated_at WHERE (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome=%s::VARCHAR FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT given.attempt_id AS attempt_id, taken.run_id AS run_id, taken.owner AS owner, taken.fence AS fence, statement_timestamp() AS db_now_3 
FROM taken JOIN (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_record(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given ON taken.run_id = given.run_id)
 SELECT taken.run_id, taken.job, taken.subject, taken.period_start, taken.version, taken.params_fingerprint, taken.params, taken.status, taken.fence, taken.owner, taken.lease_expires_at, taken.attempts, taken.raw_input, taken.output, taken.error, taken.completed_attempt_id, taken.completed_flow_run_id, taken.completed_task_run_id, taken.model_calls, taken.created_at, taken.updated_at, taken.completed_at, taken.revision, taken.revises_run_id, taken.revision_reason, taken.resend, taken.requested_by, taken.pruned_at, taken.output_digest 
FROM taken;

-- name: enter_runs
-- Register and claim a tick's Runs, given as one JSON array, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: param_2, param_3, owner, param_4, lease, runs, param_5, fence_1, attempts_1, status_1, status_2, param_1, runs
WITH taken AS 
(INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, %s::VARCHAR AS anon_1, %s::INTEGER AS anon_2, %s::VARCHAR AS anon_3, %s::INTEGER AS anon_4, (statement_timestamp() + make_interval(secs => %s)) AS db_now_1, statement_timestamp() AS db_now_2, statement_timestamp() AS db_now__1 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given 
WHERE true ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = %s::VARCHAR, fence = (runs.fence + %s::INTEGER), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + %s::INTEGER), updated_at = excluded.updated_at WHERE (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome=%s::VARCHAR FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT given.attempt_id AS attempt_id, taken.run_id AS run_id, taken.owner AS owner, taken.fence AS fence, statement_timestamp() AS db_now_3 
FROM taken JOIN (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given ON taken.run_id = given.run_id)
 SELECT taken.run_id, taken.job, taken.subject, taken.period_start, taken.version, taken.params_fingerprint, taken.params, taken.status, taken.fence, taken.owner, taken.lease_expires_at, taken.attempts, taken.raw_input, taken.output, taken.error, taken.completed_attempt_id, taken.completed_flow_run_id, taken.completed_task_run_id, taken.model_calls, taken.created_at, taken.updated_at, taken.completed_at, taken.revision, taken.revises_run_id, taken.revision_reason, taken.resend, taken.requested_by, taken.pruned_at, taken.output_digest 
FROM taken;

-- name: renew_leases
-- Extend the lease of every given Run still held under its fence and owner, from the database
-- clock; a Run whose fence moved on is left out.
-- parameters: lease, claims, status_1
UPDATE runs SET lease_expires_at=(statement_timestamp() + make_interval(secs => %s)), updated_at=statement_timestamp() WHERE (runs.run_id, runs.fence, runs.owner) IN (SELECT given.run_id, given.fence, given.owner 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), fence INTEGER, owner VARCHAR(300))) AND runs.status = %s::VARCHAR RETURNING runs.run_id, runs.lease_expires_at;

-- name: renew_lease
-- Extend the lease from the database clock; only the current fence holder can.
-- parameters: lease, run_id, fence, owner, status_1
UPDATE runs SET lease_expires_at=(statement_timestamp() + make_interval(secs => %s)), updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.fence = %s::INTEGER AND runs.owner = %s::VARCHAR AND runs.status = %s::VARCHAR RETURNING runs.lease_expires_at;

-- name: save_input
-- Store the raw input once (the first writer's value stays) and return the stored one; only the
-- current fence holder can.
-- parameters: raw_input, run_id, fence, owner, status_1
UPDATE runs SET raw_input=coalesce(runs.raw_input, %s::JSONB), updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.fence = %s::INTEGER AND runs.owner = %s::VARCHAR AND runs.status = %s::VARCHAR RETURNING runs.raw_input;

-- name: complete_run
-- Accept the output, clear the lease, add the Attempt's model calls and record the flow run and
-- task run that completed it; only the current fence holder can (PostgreSQL: with the outbox rows
-- and the Attempt's end in the same statement, written only if the Run was accepted).
-- parameters: param_1, output, attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, run_id, fence, owner, status_1, outcome, error, model_calls, attempt_id, param_2, param_3, param_4, messages
WITH accepted AS 
(UPDATE runs SET status=%s::VARCHAR, owner=NULL, lease_expires_at=NULL, output=%s::JSONB, error=NULL, completed_attempt_id=%s::VARCHAR, completed_flow_run_id=%s::VARCHAR, completed_task_run_id=%s::VARCHAR, model_calls=(runs.model_calls + %s::INTEGER), updated_at=statement_timestamp(), completed_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.fence = %s::INTEGER AND runs.owner = %s::VARCHAR AND runs.status = %s::VARCHAR RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
finished AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome=%s::VARCHAR, error=%s::VARCHAR, model_calls=%s::INTEGER WHERE attempts.attempt_id = %s::VARCHAR AND (EXISTS (SELECT accepted.run_id 
FROM accepted))), 
queued AS 
(INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, headers, status, attempts, fence, next_attempt_at, created_at, updated_at) SELECT given.message_id AS message_id, given.run_id AS run_id, given.channel AS channel, given.recipient AS recipient, given.subject AS subject, given.body AS body, given.headers AS headers, %s::VARCHAR AS anon_1, %s::INTEGER AS anon_2, %s::INTEGER AS anon_3, statement_timestamp() AS db_now_1, statement_timestamp() AS db_now__1, statement_timestamp() AS db_now__2 
FROM (SELECT given.message_id AS message_id, given.run_id AS run_id, given.channel AS channel, given.recipient AS recipient, given.subject AS subject, given.body AS body, given.headers AS headers 
FROM jsonb_to_recordset(%s::JSONB) AS given(message_id VARCHAR(64), run_id VARCHAR(64), channel VARCHAR(32), recipient VARCHAR(320), subject TEXT, body TEXT, headers JSONB)) AS given 
WHERE EXISTS (SELECT accepted.run_id 
FROM accepted) ON CONFLICT DO NOTHING)
 SELECT accepted.run_id, accepted.job, accepted.subject, accepted.period_start, accepted.version, accepted.params_fingerprint, accepted.params, accepted.status, accepted.fence, accepted.owner, accepted.lease_expires_at, accepted.attempts, accepted.raw_input, accepted.output, accepted.error, accepted.completed_attempt_id, accepted.completed_flow_run_id, accepted.completed_task_run_id, accepted.model_calls, accepted.created_at, accepted.updated_at, accepted.completed_at, accepted.revision, accepted.revises_run_id, accepted.revision_reason, accepted.resend, accepted.requested_by, accepted.pruned_at, accepted.output_digest 
FROM accepted;

-- name: finish_attempt
-- End the Attempt with its outcome (completed, released, failed), error and model calls.
-- parameters: outcome, error, model_calls, attempt_id
UPDATE attempts SET finished_at=statement_timestamp(), outcome=%s::VARCHAR, error=%s::VARCHAR, model_calls=%s::INTEGER WHERE attempts.attempt_id = %s::VARCHAR;

-- name: release_or_fail_run
-- Record the error, add the Attempt's model calls and clear the lease, the Run going back to
-- pending (retryable) or to failed; only the current fence holder can.
-- parameters: status, error, model_calls, run_id, fence, owner, status_1
UPDATE runs SET status=%s::VARCHAR, owner=NULL, lease_expires_at=NULL, error=%s::VARCHAR, model_calls=(runs.model_calls + %s::INTEGER), updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.fence = %s::INTEGER AND runs.owner = %s::VARCHAR AND runs.status = %s::VARCHAR RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: requeue_run
-- Operator action: a failed Run goes back to pending; no other status can.
-- parameters: status, run_id, status_1
UPDATE runs SET status=%s::VARCHAR, updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.status = %s::VARCHAR RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: get_runs
-- Many Runs by id.
-- parameters: ids
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64)));

-- name: get_finished_runs
-- What a rerun needs of the completed and failed Runs among the given ids, and of their later
-- completed revisions (the caller keeps the latest): not their raw inputs, which can be large.
-- parameters: ids, status_1, status_2, status_3
SELECT asked.run_id AS asked_id, runs.run_id, runs.status, runs.params_fingerprint, runs.attempts, runs.output, runs.error, runs.revision, runs.pruned_at, runs.output_digest 
FROM runs AS asked JOIN runs ON runs.job = asked.job AND runs.subject = asked.subject AND runs.period_start = asked.period_start AND runs.version = asked.version 
WHERE asked.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) AND (runs.revision = asked.revision AND (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR) OR runs.revision > asked.revision AND runs.status = %s::VARCHAR);

-- name: list_revisions
-- Every revision of the logical run of the given Run (any of its revisions), oldest first, without
-- documents.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs AS given JOIN runs ON runs.job = given.job AND runs.subject = given.subject AND runs.period_start = given.period_start AND runs.version = given.version 
WHERE given.run_id = %s::VARCHAR ORDER BY runs.revision;

-- name: request_revision
-- Insert the next revision of a logical run as pending, only if the revision before it is finished
-- (at most one unfinished revision per Run); the identity key lets one of two concurrent requests
-- win.
-- parameters: run_id, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, recollect, param_1, param_2, param_3, source_run_id, revises_run_id, revision, param_4, status_1, status_2, revision_1
INSERT INTO runs (run_id, job, subject, period_start, version, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, raw_input, status, fence, attempts, created_at, updated_at) SELECT %s::VARCHAR AS anon_1, source.job, source.subject, source.period_start, source.version, %s::INTEGER AS anon_2, %s::VARCHAR AS anon_3, %s::VARCHAR AS anon_4, %s AS anon_5, %s::VARCHAR AS anon_6, %s::VARCHAR AS anon_7, %s::JSONB AS anon_8, CASE WHEN %s THEN NULL ELSE source.raw_input END AS anon_9, %s::VARCHAR AS anon_10, %s::INTEGER AS anon_11, %s::INTEGER AS anon_12, statement_timestamp() AS db_now_1, statement_timestamp() AS db_now_2 
FROM runs AS source 
WHERE source.run_id = %s::VARCHAR AND (EXISTS (SELECT prev.run_id 
FROM runs AS prev 
WHERE prev.run_id = %s::VARCHAR AND prev.revision = %s::INTEGER - %s::INTEGER AND (prev.status = %s::VARCHAR OR prev.status = %s::VARCHAR AND prev.revision > %s::INTEGER))) ON CONFLICT DO NOTHING RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: list_runs
-- The latest Runs, newest period first, optionally of one job and one status.
-- parameters: job, job, status, status, limit
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE (CAST(%s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%s::VARCHAR AS VARCHAR(200))) AND (CAST(%s::VARCHAR AS VARCHAR(16)) IS NULL OR runs.status = CAST(%s::VARCHAR AS VARCHAR(16))) ORDER BY runs.period_start DESC, runs.subject 
 LIMIT %s::INTEGER;

-- name: list_attempts
-- A Run's Attempts in claim (fence) order.
-- parameters: run_id
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id = %s::VARCHAR ORDER BY attempts.fence;

-- name: list_attempts_of_runs
-- The Attempts of the Runs whose ids are given, per Run in claim (fence) order: one statement for
-- a whole list of Runs.
-- parameters: ids
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) ORDER BY attempts.run_id, attempts.fence;

-- name: owe_subjects
-- Record from which period a job owes each given subject, once: a subject already recorded keeps
-- its first value.
-- parameters: owed
INSERT INTO obligations (job, subject, owed_from, created_at) SELECT given.job, given.subject, given.owed_from, statement_timestamp() AS db_now_1 
FROM (SELECT given.job AS job, given.subject AS subject, given.owed_from AS owed_from 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200), subject VARCHAR(500), owed_from TIMESTAMP WITH TIME ZONE)) AS given 
WHERE true ON CONFLICT DO NOTHING;

-- name: read_obligations
-- The subjects a job owes and the period each is owed from.
-- parameters: job
SELECT obligations.subject, obligations.owed_from 
FROM obligations 
WHERE obligations.job = %s::VARCHAR ORDER BY obligations.subject;

-- name: skip_occurrences
-- Record each given occurrence as skipped by the missed-run policy, with its reason, unless a Run
-- of it exists (started occurrences are re-driven, never skipped) or it is skipped already.
-- parameters: occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, skip_reason, skipped_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, given.skip_reason, statement_timestamp() AS db_now_1, statement_timestamp() AS db_now__1, statement_timestamp() AS db_now__2 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.skip_reason AS skip_reason 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), skip_reason TEXT)) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id)) ON CONFLICT (run_id) DO UPDATE SET skipped_at = excluded.skipped_at, skip_reason = excluded.skip_reason, updated_at = excluded.updated_at, skip_emitted_at = NULL WHERE occurrences.skipped_at IS NULL RETURNING occurrences.run_id;

-- name: unskip_occurrences
-- An operator runs skipped occurrences on purpose: their skip is cleared (the reason stays until
-- it runs).
-- parameters: ids
UPDATE occurrences SET skipped_at=NULL, updated_at=statement_timestamp() WHERE occurrences.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) AND occurrences.skipped_at IS NOT NULL RETURNING occurrences.run_id;

-- name: mark_overdue
-- Report each given occurrence overdue once: not if its Run completed, it was skipped by policy or
-- it was reported already.
-- parameters: occurrences, status_1
INSERT INTO occurrences (run_id, job, subject, period_start, version, overdue_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, statement_timestamp() AS db_now_1, statement_timestamp() AS db_now__1, statement_timestamp() AS db_now__2 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100))) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id AND runs.status = %s::VARCHAR)) ON CONFLICT (run_id) DO UPDATE SET overdue_at = excluded.overdue_at, updated_at = excluded.updated_at WHERE occurrences.overdue_at IS NULL AND occurrences.skipped_at IS NULL RETURNING occurrences.run_id;

-- name: mark_recovered
-- An overdue occurrence of the job whose Run has since completed is reported recovered, once.
-- parameters: job, status_1
UPDATE occurrences SET recovered_at=statement_timestamp(), updated_at=statement_timestamp() WHERE occurrences.job = %s::VARCHAR AND occurrences.overdue_at IS NOT NULL AND occurrences.recovered_at IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = occurrences.run_id AND runs.status = %s::VARCHAR)) RETURNING occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until;

-- name: give_up_run
-- A stranded Run (pending, or running on an expired lease) that used up its attempts fails for
-- good, naming its last error; a live or finished Run is left alone.
-- parameters: status, error, run_id, max_attempts, status_1, status_2
UPDATE runs SET status=%s::VARCHAR, owner=NULL, lease_expires_at=NULL, error=%s::VARCHAR, updated_at=statement_timestamp() WHERE runs.run_id = %s::VARCHAR AND runs.attempts >= %s::INTEGER AND (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR AND runs.lease_expires_at <= statement_timestamp()) RETURNING runs.job, runs.subject, runs.period_start, runs.version;

-- name: record_give_up
-- A Run given up is recorded on its occurrence (a new give-up after an operator's requeue is a new
-- decision, its event not emitted yet).
-- parameters: occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, gave_up_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, statement_timestamp() AS db_now_1, statement_timestamp() AS db_now__1, statement_timestamp() AS db_now__2 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100))) AS given 
WHERE true ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at, gave_up_at = excluded.gave_up_at, gave_up_emitted_at = NULL;

-- name: claim_decision_events
-- Lease the job's occurrences that have a decision whose event is not known to be emitted, unless
-- another pass holds them on a live lease (database clock).
-- parameters: lease, job
UPDATE occurrences SET emitting_until=(statement_timestamp() + make_interval(secs => %s)) WHERE occurrences.job = %s::VARCHAR AND (occurrences.skipped_at IS NOT NULL AND occurrences.skip_emitted_at IS NULL OR occurrences.overdue_at IS NOT NULL AND occurrences.overdue_emitted_at IS NULL OR occurrences.recovered_at IS NOT NULL AND occurrences.recovered_emitted_at IS NULL OR occurrences.gave_up_at IS NOT NULL AND occurrences.gave_up_emitted_at IS NULL) AND (occurrences.emitting_until IS NULL OR occurrences.emitting_until <= statement_timestamp()) RETURNING occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until;

-- name: mark_decision_events_emitted
-- The given decisions' events were handed to the Prefect server: each is recorded emitted (if it
-- is still the decision made then), and the lease is given back.
-- parameters: emitted
UPDATE occurrences SET skip_emitted_at=CASE WHEN (occurrences.skipped_at = given.skipped_at) THEN statement_timestamp() ELSE occurrences.skip_emitted_at END, overdue_emitted_at=CASE WHEN (occurrences.overdue_at = given.overdue_at) THEN statement_timestamp() ELSE occurrences.overdue_emitted_at END, recovered_emitted_at=CASE WHEN (occurrences.recovered_at = given.recovered_at) THEN statement_timestamp() ELSE occurrences.recovered_emitted_at END, gave_up_emitted_at=CASE WHEN (occurrences.gave_up_at = given.gave_up_at) THEN statement_timestamp() ELSE occurrences.gave_up_emitted_at END, emitting_until=NULL FROM (SELECT given.run_id AS run_id, given.skipped_at AS skipped_at, given.overdue_at AS overdue_at, given.recovered_at AS recovered_at, given.gave_up_at AS gave_up_at 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), skipped_at TIMESTAMP WITH TIME ZONE, overdue_at TIMESTAMP WITH TIME ZONE, recovered_at TIMESTAMP WITH TIME ZONE, gave_up_at TIMESTAMP WITH TIME ZONE)) AS given WHERE occurrences.run_id = given.run_id;

-- name: read_run_states
-- Where each Run of a job stands from a period on (no documents), with whether its lease expired
-- by the database clock; revision 0 only, what the job owes (a revision is an operator's, resumed
-- by its own revise flow run).
-- parameters: job, since, revision_1
SELECT runs.run_id, runs.subject, runs.period_start, runs.version, runs.status, runs.attempts, runs.model_calls, runs.updated_at, runs.error, coalesce(runs.lease_expires_at <= statement_timestamp(), false) AS lease_expired 
FROM runs 
WHERE runs.job = %s::VARCHAR AND runs.period_start >= %s::TIMESTAMP WITH TIME ZONE AND runs.revision = %s::INTEGER ORDER BY runs.period_start, runs.subject;

-- name: read_occurrences
-- The decisions and alerts about a job's occurrences from a period on.
-- parameters: job, since
SELECT occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until 
FROM occurrences 
WHERE occurrences.job = %s::VARCHAR AND occurrences.period_start >= %s::TIMESTAMP WITH TIME ZONE ORDER BY occurrences.period_start, occurrences.subject;

-- name: claim_messages
-- Lease the due messages, skipping rows another dispatcher has locked (PostgreSQL: due and taken
-- in one statement); each claim bumps the fence and counts the attempt.
-- parameters: status_1, channel, channel, limit, status, attempts_1, fence_1, owner, lease
WITH due AS 
(SELECT outbox.message_id AS message_id, outbox.status AS status 
FROM outbox 
WHERE status IN ('pending', 'retry', 'uncertain', 'sending') AND outbox.next_attempt_at <= statement_timestamp() AND (outbox.status != %s::VARCHAR OR outbox.lease_expires_at <= statement_timestamp()) AND (CAST(%s::VARCHAR AS VARCHAR(32)) IS NULL OR outbox.channel = CAST(%s::VARCHAR AS VARCHAR(32))) ORDER BY outbox.next_attempt_at, outbox.message_id 
 LIMIT %s::INTEGER FOR UPDATE SKIP LOCKED)
 UPDATE outbox SET status=%s::VARCHAR, attempts=(outbox.attempts + %s::INTEGER), fence=(outbox.fence + %s::INTEGER), lease_owner=%s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %s)), claimed_at=statement_timestamp(), updated_at=statement_timestamp() FROM due WHERE outbox.message_id = due.message_id RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, due.status AS previous_status;

-- name: record_delivery_outcome
-- sending -> retry, uncertain or dead, with the error and when it is due again (database clock, or
-- never); only the current delivery-lease holder can (PostgreSQL: with its delivery attempt row in
-- the same statement).
-- parameters: outcome, delay, delay, last_error, message_id, fence, owner, status_1, message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id
WITH updated AS 
(UPDATE outbox SET status=%s::VARCHAR, lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=CASE WHEN (CAST(%s AS FLOAT) IS NULL) THEN NULL ELSE (statement_timestamp() + make_interval(secs => %s)) END, last_error=%s::VARCHAR, updated_at=statement_timestamp() WHERE outbox.message_id = %s::VARCHAR AND outbox.fence = %s::INTEGER AND outbox.lease_owner = %s::VARCHAR AND outbox.status = %s::VARCHAR RETURNING outbox.message_id), 
recorded AS 
(INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id, finished_at) SELECT %s::VARCHAR AS anon_1, %s::INTEGER AS anon_2, %s::VARCHAR AS anon_3, %s::TIMESTAMP WITH TIME ZONE AS anon_4, %s::VARCHAR AS anon_5, %s::INTEGER AS anon_6, %s::VARCHAR AS anon_7, %s::VARCHAR AS anon_8, statement_timestamp() AS db_now_1 
WHERE EXISTS (SELECT updated.message_id 
FROM updated))
 SELECT updated.message_id 
FROM updated;

-- name: mark_sent
-- sending -> sent for the given messages, each only by its current delivery-lease holder
-- (PostgreSQL: with their delivery attempt rows in the same statement).
-- parameters: sent, param_2, status_1, param_3, param_1
WITH given AS 
(SELECT given.message_id AS message_id, given.fence AS fence, given.owner AS owner, given.reply_code AS reply_code, given.reply_text AS reply_text, given.provider_message_id AS provider_message_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(message_id VARCHAR(64), fence INTEGER, owner VARCHAR(300), reply_code INTEGER, reply_text TEXT, provider_message_id VARCHAR(300))), 
updated AS 
(UPDATE outbox SET status=%s::VARCHAR, lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=NULL, last_error=NULL, provider_message_id=given.provider_message_id, updated_at=statement_timestamp(), sent_at=statement_timestamp() FROM given WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.lease_owner = given.owner AND (outbox.status || %s::VARCHAR) = %s::VARCHAR AND outbox.message_id = ANY (array((SELECT given.message_id 
FROM given))) RETURNING outbox.message_id, outbox.attempts, outbox.claimed_at, given.owner, given.reply_code, given.reply_text, given.provider_message_id), 
recorded AS 
(INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id, finished_at) SELECT updated.message_id AS message_id, updated.attempts AS attempts, updated.owner AS owner, updated.claimed_at AS claimed_at, %s::VARCHAR AS anon_1, updated.reply_code AS reply_code, updated.reply_text AS reply_text, updated.provider_message_id AS provider_message_id, statement_timestamp() AS db_now_1 
FROM updated)
 SELECT updated.message_id 
FROM updated;

-- name: read_sent_by_claim
-- Which of the given messages are sent already by the given claim (its fence, and its attempt
-- recorded sent by its owner): a mark retried after its commit succeeded.
-- parameters: sent, status_1, outcome_1
SELECT outbox.message_id 
FROM outbox, (SELECT given.message_id AS message_id, given.fence AS fence, given.owner AS owner, given.attempt AS attempt 
FROM jsonb_to_recordset(%s::JSONB) AS given(message_id VARCHAR(64), fence INTEGER, owner VARCHAR(300), attempt INTEGER)) AS given 
WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.status = %s::VARCHAR AND (EXISTS (SELECT delivery_attempts.id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = given.message_id AND delivery_attempts.attempt = given.attempt AND delivery_attempts.owner = given.owner AND delivery_attempts.outcome = %s::VARCHAR));

-- name: release_message
-- A claimed message never handed to a transport returns to the status it was claimed from, due
-- now, and its try is not counted; only its lease holder can.
-- parameters: status, attempts_1, message_id, fence, owner, status_1
UPDATE outbox SET status=%s::VARCHAR, attempts=(outbox.attempts - %s::INTEGER), lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=statement_timestamp(), updated_at=statement_timestamp() WHERE outbox.message_id = %s::VARCHAR AND outbox.fence = %s::INTEGER AND outbox.lease_owner = %s::VARCHAR AND outbox.status = %s::VARCHAR;

-- name: requeue_message
-- Operator action: a retry, uncertain or dead message is due now, with the same key; no other
-- status can be requeued.
-- parameters: status, message_id, status_1, status_2, status_3
UPDATE outbox SET status=%s::VARCHAR, next_attempt_at=statement_timestamp(), updated_at=statement_timestamp() WHERE outbox.message_id = %s::VARCHAR AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR) RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at;

-- name: get_message
-- An outbox message by id.
-- parameters: message_id
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at 
FROM outbox 
WHERE outbox.message_id = %s::VARCHAR;

-- name: list_messages
-- Outbox messages, oldest first, optionally of one status and one Run.
-- parameters: status, status, run_id, run_id, limit
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at 
FROM outbox 
WHERE (CAST(%s::VARCHAR AS VARCHAR(16)) IS NULL OR outbox.status = CAST(%s::VARCHAR AS VARCHAR(16))) AND (CAST(%s::VARCHAR AS VARCHAR(64)) IS NULL OR outbox.run_id = CAST(%s::VARCHAR AS VARCHAR(64))) ORDER BY outbox.created_at, outbox.message_id 
 LIMIT %s::INTEGER;

-- name: list_delivery_attempts
-- A message's delivery attempts in order.
-- parameters: message_id
SELECT delivery_attempts.id, delivery_attempts.message_id, delivery_attempts.attempt, delivery_attempts.owner, delivery_attempts.started_at, delivery_attempts.finished_at, delivery_attempts.outcome, delivery_attempts.reply_code, delivery_attempts.reply_text, delivery_attempts.provider_message_id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = %s::VARCHAR ORDER BY delivery_attempts.attempt;

-- name: count_messages
-- Outbox messages per status.
SELECT outbox.status, count(*) AS messages 
FROM outbox GROUP BY outbox.status;

-- name: count_suppressed
-- Add one tick's Runs asked for again (completed: duplicates; leased by another worker: in
-- progress elsewhere) to its job's counts for the UTC day.
-- parameters: job, day, duplicates, in_progress_elsewhere
INSERT INTO suppressed_counts (job, day, duplicates, in_progress_elsewhere, updated_at) VALUES (%s::VARCHAR, %s::DATE, %s::INTEGER, %s::INTEGER, statement_timestamp()) ON CONFLICT (job, day) DO UPDATE SET duplicates = (suppressed_counts.duplicates + excluded.duplicates), in_progress_elsewhere = (suppressed_counts.in_progress_elsewhere + excluded.in_progress_elsewhere), updated_at = excluded.updated_at;

-- name: read_completed_since
-- The Runs completed from a moment on (optionally of one job): job, completion time and attempts,
-- no documents.
-- parameters: status_1, since, job, job
SELECT runs.job, runs.completed_at, runs.attempts 
FROM runs 
WHERE runs.status = %s::VARCHAR AND runs.completed_at >= %s::TIMESTAMP WITH TIME ZONE AND (CAST(%s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%s::VARCHAR AS VARCHAR(200)));

-- name: read_attempts_since
-- The Attempts started or ended from a moment on (optionally of one job's Runs): times, outcome
-- and model calls.
-- parameters: since, since, job, job
SELECT runs.job, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.model_calls 
FROM attempts JOIN runs ON runs.run_id = attempts.run_id 
WHERE (attempts.started_at >= %s::TIMESTAMP WITH TIME ZONE OR attempts.finished_at >= %s::TIMESTAMP WITH TIME ZONE) AND (CAST(%s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%s::VARCHAR AS VARCHAR(200)));

-- name: read_messages_since
-- The outbox messages queued from a moment on (optionally of one job's Runs): queue time and
-- status.
-- parameters: since, job, job
SELECT runs.job, outbox.created_at, outbox.status 
FROM outbox JOIN runs ON runs.run_id = outbox.run_id 
WHERE outbox.created_at >= %s::TIMESTAMP WITH TIME ZONE AND (CAST(%s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%s::VARCHAR AS VARCHAR(200)));

-- name: read_suppressed_since
-- The suppressed counts from a UTC day on (optionally of one job).
-- parameters: day, job, job
SELECT suppressed_counts.job, suppressed_counts.day, suppressed_counts.duplicates, suppressed_counts.in_progress_elsewhere 
FROM suppressed_counts 
WHERE suppressed_counts.day >= %s::DATE AND (CAST(%s::VARCHAR AS VARCHAR(200)) IS NULL OR suppressed_counts.job = CAST(%s::VARCHAR AS VARCHAR(200)));

-- name: prune_window
-- The id of the last of the next Runs in id order after the cursor (at most limit of them): the
-- end of a prune batch's window.
-- parameters: after, limit
SELECT max(run_id) AS until 
FROM (SELECT runs.run_id AS run_id 
FROM runs 
WHERE runs.run_id > %s::VARCHAR ORDER BY runs.run_id 
 LIMIT %s::INTEGER) AS "window";

-- name: pick_prunable_runs
-- Lock the Runs of the batch's window (ids after the cursor, up to its end) that are completed
-- before the cutoff, of the given jobs, not tombstones and without an outbox message still to
-- deliver, with their outputs (to digest) and their documents' stored size.
-- parameters: after, until, status_1, cutoff, jobs, status_2, status_3, status_4, status_5
SELECT runs.run_id, runs.output, coalesce(pg_column_size(runs.raw_input), 0) + coalesce(pg_column_size(runs.output), 0) + coalesce(pg_column_size(runs.error), 0) + coalesce(pg_column_size(runs.params), 0) AS document_bytes 
FROM runs 
WHERE runs.run_id > %s::VARCHAR AND runs.run_id <= %s::VARCHAR AND runs.status = %s::VARCHAR AND runs.pruned_at IS NULL AND runs.completed_at < %s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200))) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR))) ORDER BY runs.run_id FOR UPDATE OF runs;

-- name: lock_pruned_messages
-- Lock the outbox rows of the picked Runs and read their status again: a message requeued since
-- the pick keeps its Run out of the batch.
-- parameters: ids
SELECT outbox.run_id, outbox.status 
FROM outbox 
WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) FOR UPDATE;

-- name: delete_pruned_delivery_attempts
-- Delete the delivery attempts of the pruned Runs' sent and dead messages.
-- parameters: ids, status_1, status_2
DELETE FROM delivery_attempts WHERE delivery_attempts.message_id IN (SELECT outbox.message_id 
FROM outbox 
WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR)) RETURNING delivery_attempts.id;

-- name: delete_pruned_messages
-- Delete the pruned Runs' sent and dead outbox rows (never a message still to deliver).
-- parameters: ids, status_1, status_2
DELETE FROM outbox WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR) RETURNING outbox.message_id;

-- name: delete_pruned_attempts
-- Delete the pruned Runs' Attempts.
-- parameters: ids
DELETE FROM attempts WHERE attempts.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) RETURNING attempts.attempt_id;

-- name: delete_pruned_occurrences
-- Delete the pruned Runs' alert occurrences (overdue, recovered) whose events are known emitted; a
-- skip decision is kept.
-- parameters: ids
DELETE FROM occurrences WHERE occurrences.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64))) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL) RETURNING occurrences.run_id;

-- name: bury_runs
-- Turn the picked completed Runs into tombstones: record their output digests and the prune time
-- (database clock), null their raw input, output, error and params; identity, status, fence,
-- fingerprint, counts and completion stay.
-- parameters: digests, status_1
UPDATE runs SET params=NULL, raw_input=NULL, output=NULL, error=NULL, updated_at=statement_timestamp(), pruned_at=statement_timestamp(), output_digest=buried.output_digest FROM (SELECT given.run_id AS run_id, given.output_digest AS output_digest 
FROM jsonb_to_recordset(%s::JSONB) AS given(run_id VARCHAR(64), output_digest VARCHAR(64))) AS buried WHERE runs.run_id = buried.run_id AND runs.status = %s::VARCHAR AND runs.pruned_at IS NULL RETURNING runs.run_id;

-- name: count_prunable
-- What a prune pass with this cutoff and these jobs would make tombstones and delete (a dry run),
-- and the Runs from before the cutoff it leaves alone, by why.
-- parameters: status_1, cutoff, jobs, status_2, status_3, status_4, status_5, coalesce_2, status_6, cutoff, jobs, status_7, status_8, status_9, status_10, status_11, cutoff, jobs, status_12, status_13, cutoff, jobs, jobs
WITH picked AS 
(SELECT runs.run_id AS run_id, coalesce(pg_column_size(runs.raw_input), 0) + coalesce(pg_column_size(runs.output), 0) + coalesce(pg_column_size(runs.error), 0) + coalesce(pg_column_size(runs.params), 0) AS size 
FROM runs 
WHERE runs.status = %s::VARCHAR AND runs.pruned_at IS NULL AND runs.completed_at < %s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200))) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR))))
 SELECT (SELECT count(*) AS count_1 
FROM picked) AS runs, (SELECT count(*) AS count_2 
FROM attempts 
WHERE attempts.run_id IN (SELECT picked.run_id 
FROM picked)) AS attempts, (SELECT count(*) AS count_3 
FROM outbox 
WHERE outbox.run_id IN (SELECT picked.run_id 
FROM picked)) AS outbox, (SELECT count(*) AS count_4 
FROM delivery_attempts 
WHERE delivery_attempts.message_id IN (SELECT outbox.message_id 
FROM outbox 
WHERE outbox.run_id IN (SELECT picked.run_id 
FROM picked))) AS delivery_attempts, (SELECT count(*) AS count_5 
FROM occurrences 
WHERE occurrences.run_id IN (SELECT picked.run_id 
FROM picked) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL)) AS occurrences, (SELECT coalesce(sum(picked.size), %s::INTEGER) AS coalesce_1 
FROM picked) AS document_bytes, (SELECT count(*) AS count_6 
FROM runs 
WHERE runs.status = %s::VARCHAR AND runs.pruned_at IS NULL AND runs.completed_at < %s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200))) AND (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR OR outbox.status = %s::VARCHAR)))) AS unfinished_outbox, (SELECT count(*) AS count_7 
FROM runs 
WHERE runs.status = %s::VARCHAR AND runs.created_at < %s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200)))) AS failed, (SELECT count(*) AS count_8 
FROM runs 
WHERE (runs.status = %s::VARCHAR OR runs.status = %s::VARCHAR) AND runs.created_at < %s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200)))) AS unfinished, (SELECT count(*) AS count_9 
FROM runs 
WHERE runs.pruned_at IS NOT NULL AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%s::JSONB) AS given(job VARCHAR(200)))) AS tombstones;

-- The SQL runledger's ledger sends to sqlite, statement by statement.
-- Written by `python -m store.sql --write`; a test fails when it is stale.

-- name: begin_write
-- A SQLite write transaction takes the write lock up front, so that it waits its turn instead of
-- failing half-way with 'database is locked'.
BEGIN IMMEDIATE;

-- name: read_clock
-- The database clock, which every lease and due time is judged by.
SELECT (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS now;

-- name: find_run_ids
-- The first Run ids in the range a prefix spans, and how many there are.
-- parameters: low, high, param_1, param_2
SELECT runs.run_id AS id, count(*) OVER () AS matches 
FROM runs 
WHERE runs.run_id BETWEEN ? AND ? ORDER BY runs.run_id
 LIMIT ? OFFSET ?;

-- name: find_message_ids
-- The first outbox message ids in the range a prefix spans, and how many there are.
-- parameters: low, high, param_1, param_2
SELECT outbox.message_id AS id, count(*) OVER () AS matches 
FROM outbox 
WHERE outbox.message_id BETWEEN ? AND ? ORDER BY outbox.message_id
 LIMIT ? OFFSET ?;

-- name: get_run
-- A Run by id.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id = ?;

-- name: register_run
-- Insert the Run as pending, once per identity: an existing Run is left as it is (its parameters
-- are compared by the caller).
-- parameters: run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, attempts
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, attempts, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')) ON CONFLICT DO NOTHING RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: claim_run
-- Take the lease of an unfinished Run whose lease is free, expired (database clock) or ours: bump
-- the fence, count the attempt (PostgreSQL: and end the previous holder's Attempt and open this
-- one's in the same statement).
-- parameters: status, fence_1, owner, lease, attempts_1, run_id, status_1, status_2, owner
UPDATE runs SET status=?, fence=(runs.fence + ?), owner=?, lease_expires_at=(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000'), attempts=(runs.attempts + ?), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND (runs.status = ? OR runs.status = ?) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') OR runs.owner = ?) RETURNING run_id, fence, lease_expires_at;

-- name: close_attempts
-- A new claim ends the previous holder's open Attempt: its lease expired or was taken over.
-- parameters: outcome, run_id
UPDATE attempts SET finished_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), outcome=? WHERE attempts.run_id = ? AND attempts.finished_at IS NULL;

-- name: open_attempt
-- One Attempt row per successful claim, unique per (run, fence).
-- parameters: attempt_id, run_id, owner, fence
INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) VALUES (?, ?, ?, ?, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'));

-- name: enter_run
-- Register and claim one Run, given as one JSON object, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: param_1, param_2, owner, param_3, lease, runs, json_extract_1, runs, json_extract_2, runs, json_extract_3, runs, json_extract_4, runs, json_extract_5, runs, json_extract_6, runs, json_extract_7, runs, json_extract_8, param_4, fence_1, attempts_1, status_1, status_2
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, given.params_fingerprint, given.params, ? AS anon_1, ? AS anon_2, ? AS anon_3, ? AS anon_4, (strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_2, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1 
FROM (SELECT json_extract(?, ?) AS run_id, json_extract(?, ?) AS job, json_extract(?, ?) AS subject, json_extract(?, ?) AS period_start, json_extract(?, ?) AS version, json_extract(?, ?) AS params_fingerprint, json_extract(?, ?) AS params, json_extract(?, ?) AS attempt_id) AS given 
WHERE 1 = 1 ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = ?, fence = (runs.fence + ?), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + ?), updated_at = excluded.updated_at WHERE (runs.status = ? OR runs.status = ?) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: enter_runs
-- Register and claim a tick's Runs, given as one JSON array, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: param_1, param_2, owner, param_3, lease, json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, json_extract_6, json_extract_7, json_extract_8, runs, param_4, fence_1, attempts_1, status_1, status_2
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, given.params_fingerprint, given.params, ? AS anon_1, ? AS anon_2, ? AS anon_3, ? AS anon_4, (strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_2, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1 
FROM (SELECT json_extract(anon_5.value, ?) AS run_id, json_extract(anon_5.value, ?) AS job, json_extract(anon_5.value, ?) AS subject, json_extract(anon_5.value, ?) AS period_start, json_extract(anon_5.value, ?) AS version, json_extract(anon_5.value, ?) AS params_fingerprint, json_extract(anon_5.value, ?) AS params, json_extract(anon_5.value, ?) AS attempt_id 
FROM json_each(?) AS anon_5) AS given 
WHERE 1 = 1 ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = ?, fence = (runs.fence + ?), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + ?), updated_at = excluded.updated_at WHERE (runs.status = ? OR runs.status = ?) AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: renew_leases
-- Extend the lease of every given Run still held under its fence and owner, from the database
-- clock; a Run whose fence moved on is left out.
-- parameters: lease, json_extract_1, json_extract_2, json_extract_3, claims, status_1
UPDATE runs SET lease_expires_at=(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE (runs.run_id, runs.fence, runs.owner) IN (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS fence, json_extract(anon_1.value, ?) AS owner 
FROM json_each(?) AS anon_1) AND runs.status = ? RETURNING run_id, lease_expires_at;

-- name: renew_lease
-- Extend the lease from the database clock; only the current fence holder can.
-- parameters: lease, run_id, fence, owner, status_1
UPDATE runs SET lease_expires_at=(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.fence = ? AND runs.owner = ? AND runs.status = ? RETURNING lease_expires_at;

-- name: save_input
-- Store the raw input once (the first writer's value stays) and return the stored one; only the
-- current fence holder can.
-- parameters: raw_input, run_id, fence, owner, status_1
UPDATE runs SET raw_input=coalesce(runs.raw_input, ?), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.fence = ? AND runs.owner = ? AND runs.status = ? RETURNING raw_input;

-- name: complete_run
-- Accept the output, clear the lease, add the Attempt's model calls and record the flow run and
-- task run that completed it; only the current fence holder can (PostgreSQL: with the outbox rows
-- and the Attempt's end in the same statement, written only if the Run was accepted).
-- parameters: status, output, attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, run_id, fence, owner, status_1
UPDATE runs SET status=?, owner=NULL, lease_expires_at=NULL, output=?, error=NULL, completed_attempt_id=?, completed_flow_run_id=?, completed_task_run_id=?, model_calls=(runs.model_calls + ?), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), completed_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.fence = ? AND runs.owner = ? AND runs.status = ? RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: queue_messages
-- The completed Run's outbox rows, one per (run, channel, recipient); a row already queued is left
-- as it is.
-- parameters: param_1, param_2, param_3, json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, json_extract_6, json_extract_7, messages
INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, headers, status, attempts, fence, next_attempt_at, created_at, updated_at) SELECT given.message_id, given.run_id, given.channel, given.recipient, given.subject, given.body, given.headers, ? AS anon_1, ? AS anon_2, ? AS anon_3, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__2 
FROM (SELECT json_extract(anon_4.value, ?) AS message_id, json_extract(anon_4.value, ?) AS run_id, json_extract(anon_4.value, ?) AS channel, json_extract(anon_4.value, ?) AS recipient, json_extract(anon_4.value, ?) AS subject, json_extract(anon_4.value, ?) AS body, json_extract(anon_4.value, ?) AS headers 
FROM json_each(?) AS anon_4) AS given 
WHERE 1 = 1 ON CONFLICT DO NOTHING;

-- name: finish_attempt
-- End the Attempt with its outcome (completed, released, failed), error and model calls.
-- parameters: outcome, error, model_calls, attempt_id
UPDATE attempts SET finished_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), outcome=?, error=?, model_calls=? WHERE attempts.attempt_id = ?;

-- name: release_or_fail_run
-- Record the error, add the Attempt's model calls and clear the lease, the Run going back to
-- pending (retryable) or to failed; only the current fence holder can.
-- parameters: status, error, model_calls, run_id, fence, owner, status_1
UPDATE runs SET status=?, owner=NULL, lease_expires_at=NULL, error=?, model_calls=(runs.model_calls + ?), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.fence = ? AND runs.owner = ? AND runs.status = ? RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: requeue_run
-- Operator action: a failed Run goes back to pending; no other status can.
-- parameters: status, run_id, status_1
UPDATE runs SET status=?, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.status = ? RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: get_runs
-- Many Runs by id.
-- parameters: json_extract_1, ids
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1);

-- name: get_finished_runs
-- What a rerun needs of the completed and failed Runs among the given ids, and of their later
-- completed revisions (the caller keeps the latest): not their raw inputs, which can be large.
-- parameters: json_extract_1, ids, status_1, status_2, status_3
SELECT asked.run_id AS asked_id, runs.run_id, runs.status, runs.params_fingerprint, runs.attempts, runs.output, runs.error, runs.revision, runs.pruned_at, runs.output_digest 
FROM runs AS asked JOIN runs ON runs.job = asked.job AND runs.subject = asked.subject AND runs.period_start = asked.period_start AND runs.version = asked.version 
WHERE asked.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) AND (runs.revision = asked.revision AND (runs.status = ? OR runs.status = ?) OR runs.revision > asked.revision AND runs.status = ?);

-- name: list_revisions
-- Every revision of the logical run of the given Run (any of its revisions), oldest first, without
-- documents.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs AS given JOIN runs ON runs.job = given.job AND runs.subject = given.subject AND runs.period_start = given.period_start AND runs.version = given.version 
WHERE given.run_id = ? ORDER BY runs.revision;

-- name: request_revision
-- Insert the next revision of a logical run as pending, only if the revision before it is finished
-- (at most one unfinished revision per Run); the identity key lets one of two concurrent requests
-- win.
-- parameters: run_id, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, recollect, param_1, param_2, param_3, source_run_id, revises_run_id, revision, param_4, status_1, status_2, revision_1
INSERT INTO runs (run_id, job, subject, period_start, version, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, raw_input, status, fence, attempts, created_at, updated_at) SELECT ? AS anon_1, source.job, source.subject, source.period_start, source.version, ? AS anon_2, ? AS anon_3, ? AS anon_4, ? AS anon_5, ? AS anon_6, ? AS anon_7, ? AS anon_8, CASE WHEN ? THEN NULL ELSE source.raw_input END AS anon_9, ? AS anon_10, ? AS anon_11, ? AS anon_12, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_2 
FROM runs AS source 
WHERE source.run_id = ? AND (EXISTS (SELECT prev.run_id 
FROM runs AS prev 
WHERE prev.run_id = ? AND prev.revision = ? - ? AND (prev.status = ? OR prev.status = ? AND prev.revision > ?))) ON CONFLICT DO NOTHING RETURNING run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, lease_expires_at, attempts, raw_input, output, error, completed_attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, created_at, updated_at, completed_at, revision, revises_run_id, revision_reason, resend, requested_by, pruned_at, output_digest;

-- name: list_runs
-- The latest Runs, newest period first, optionally of one job and one status.
-- parameters: job, job, status, status, limit, param_1
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE (CAST(? AS VARCHAR(200)) IS NULL OR runs.job = CAST(? AS VARCHAR(200))) AND (CAST(? AS VARCHAR(16)) IS NULL OR runs.status = CAST(? AS VARCHAR(16))) ORDER BY runs.period_start DESC, runs.subject
 LIMIT ? OFFSET ?;

-- name: list_attempts
-- A Run's Attempts in claim (fence) order.
-- parameters: run_id
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id = ? ORDER BY attempts.fence;

-- name: list_attempts_of_runs
-- The Attempts of the Runs whose ids are given, per Run in claim (fence) order: one statement for
-- a whole list of Runs.
-- parameters: json_extract_1, ids
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) ORDER BY attempts.run_id, attempts.fence;

-- name: owe_subjects
-- Record from which period a job owes each given subject, once: a subject already recorded keeps
-- its first value.
-- parameters: json_extract_1, json_extract_2, json_extract_3, owed
INSERT INTO obligations (job, subject, owed_from, created_at) SELECT given.job, given.subject, given.owed_from, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1 
FROM (SELECT json_extract(anon_1.value, ?) AS job, json_extract(anon_1.value, ?) AS subject, json_extract(anon_1.value, ?) AS owed_from 
FROM json_each(?) AS anon_1) AS given 
WHERE 1 = 1 ON CONFLICT DO NOTHING;

-- name: read_obligations
-- The subjects a job owes and the period each is owed from.
-- parameters: job
SELECT obligations.subject, obligations.owed_from 
FROM obligations 
WHERE obligations.job = ? ORDER BY obligations.subject;

-- name: skip_occurrences
-- Record each given occurrence as skipped by the missed-run policy, with its reason, unless a Run
-- of it exists (started occurrences are re-driven, never skipped) or it is skipped already.
-- parameters: json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, json_extract_6, occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, skip_reason, skipped_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, given.skip_reason, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__2 
FROM (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS job, json_extract(anon_1.value, ?) AS subject, json_extract(anon_1.value, ?) AS period_start, json_extract(anon_1.value, ?) AS version, json_extract(anon_1.value, ?) AS skip_reason 
FROM json_each(?) AS anon_1) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id)) ON CONFLICT (run_id) DO UPDATE SET skipped_at = excluded.skipped_at, skip_reason = excluded.skip_reason, updated_at = excluded.updated_at, skip_emitted_at = NULL WHERE occurrences.skipped_at IS NULL RETURNING run_id;

-- name: unskip_occurrences
-- An operator runs skipped occurrences on purpose: their skip is cleared (the reason stays until
-- it runs).
-- parameters: json_extract_1, ids
UPDATE occurrences SET skipped_at=NULL, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE occurrences.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) AND occurrences.skipped_at IS NOT NULL RETURNING run_id;

-- name: mark_overdue
-- Report each given occurrence overdue once: not if its Run completed, it was skipped by policy or
-- it was reported already.
-- parameters: json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, occurrences, status_1
INSERT INTO occurrences (run_id, job, subject, period_start, version, overdue_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__2 
FROM (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS job, json_extract(anon_1.value, ?) AS subject, json_extract(anon_1.value, ?) AS period_start, json_extract(anon_1.value, ?) AS version 
FROM json_each(?) AS anon_1) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id AND runs.status = ?)) ON CONFLICT (run_id) DO UPDATE SET overdue_at = excluded.overdue_at, updated_at = excluded.updated_at WHERE occurrences.overdue_at IS NULL AND occurrences.skipped_at IS NULL RETURNING run_id;

-- name: mark_recovered
-- An overdue occurrence of the job whose Run has since completed is reported recovered, once.
-- parameters: job, status_1
UPDATE occurrences SET recovered_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE occurrences.job = ? AND occurrences.overdue_at IS NOT NULL AND occurrences.recovered_at IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = occurrences.run_id AND runs.status = ?)) RETURNING run_id, job, subject, period_start, version, skipped_at, skip_reason, overdue_at, recovered_at, created_at, updated_at, gave_up_at, skip_emitted_at, overdue_emitted_at, recovered_emitted_at, gave_up_emitted_at, emitting_until;

-- name: give_up_run
-- A stranded Run (pending, or running on an expired lease) that used up its attempts fails for
-- good, naming its last error; a live or finished Run is left alone.
-- parameters: status, error, run_id, max_attempts, status_1, status_2
UPDATE runs SET status=?, owner=NULL, lease_expires_at=NULL, error=?, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE runs.run_id = ? AND runs.attempts >= ? AND (runs.status = ? OR runs.status = ? AND runs.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')) RETURNING job, subject, period_start, version;

-- name: record_give_up
-- A Run given up is recorded on its occurrence (a new give-up after an operator's requeue is a new
-- decision, its event not emitted yet).
-- parameters: json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, gave_up_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__1, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now__2 
FROM (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS job, json_extract(anon_1.value, ?) AS subject, json_extract(anon_1.value, ?) AS period_start, json_extract(anon_1.value, ?) AS version 
FROM json_each(?) AS anon_1) AS given 
WHERE 1 = 1 ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at, gave_up_at = excluded.gave_up_at, gave_up_emitted_at = NULL;

-- name: claim_decision_events
-- Lease the job's occurrences that have a decision whose event is not known to be emitted, unless
-- another pass holds them on a live lease (database clock).
-- parameters: lease, job
UPDATE occurrences SET emitting_until=(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000') WHERE occurrences.job = ? AND (occurrences.skipped_at IS NOT NULL AND occurrences.skip_emitted_at IS NULL OR occurrences.overdue_at IS NOT NULL AND occurrences.overdue_emitted_at IS NULL OR occurrences.recovered_at IS NOT NULL AND occurrences.recovered_emitted_at IS NULL OR occurrences.gave_up_at IS NOT NULL AND occurrences.gave_up_emitted_at IS NULL) AND (occurrences.emitting_until IS NULL OR occurrences.emitting_until <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')) RETURNING run_id, job, subject, period_start, version, skipped_at, skip_reason, overdue_at, recovered_at, created_at, updated_at, gave_up_at, skip_emitted_at, overdue_emitted_at, recovered_emitted_at, gave_up_emitted_at, emitting_until;

-- name: mark_decision_events_emitted
-- The given decisions' events were handed to the Prefect server: each is recorded emitted (if it
-- is still the decision made then), and the lease is given back.
-- parameters: json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, emitted
UPDATE occurrences SET skip_emitted_at=CASE WHEN (occurrences.skipped_at = given.skipped_at) THEN (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') ELSE occurrences.skip_emitted_at END, overdue_emitted_at=CASE WHEN (occurrences.overdue_at = given.overdue_at) THEN (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') ELSE occurrences.overdue_emitted_at END, recovered_emitted_at=CASE WHEN (occurrences.recovered_at = given.recovered_at) THEN (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') ELSE occurrences.recovered_emitted_at END, gave_up_emitted_at=CASE WHEN (occurrences.gave_up_at = given.gave_up_at) THEN (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') ELSE occurrences.gave_up_emitted_at END, emitting_until=NULL FROM (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS skipped_at, json_extract(anon_1.value, ?) AS overdue_at, json_extract(anon_1.value, ?) AS recovered_at, json_extract(anon_1.value, ?) AS gave_up_at 
FROM json_each(?) AS anon_1) AS given WHERE occurrences.run_id = given.run_id;

-- name: read_run_states
-- Where each Run of a job stands from a period on (no documents), with whether its lease expired
-- by the database clock; revision 0 only, what the job owes (a revision is an operator's, resumed
-- by its own revise flow run).
-- parameters: job, since, revision_1
SELECT runs.run_id, runs.subject, runs.period_start, runs.version, runs.status, runs.attempts, runs.model_calls, runs.updated_at, runs.error, coalesce(runs.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), 0) AS lease_expired 
FROM runs 
WHERE runs.job = ? AND runs.period_start >= ? AND runs.revision = ? ORDER BY runs.period_start, runs.subject;

-- name: read_occurrences
-- The decisions and alerts about a job's occurrences from a period on.
-- parameters: job, since
SELECT occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until 
FROM occurrences 
WHERE occurrences.job = ? AND occurrences.period_start >= ? ORDER BY occurrences.period_start, occurrences.subject;

-- name: due_messages
-- The due messages (or ones whose delivery lease expired) in claim order, optionally of one
-- channel.
-- parameters: status_1, channel, channel, limit, param_1
SELECT outbox.message_id, outbox.status 
FROM outbox 
WHERE status IN ('pending', 'retry', 'uncertain', 'sending') AND outbox.next_attempt_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AND (outbox.status != ? OR outbox.lease_expires_at <= (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')) AND (CAST(? AS VARCHAR(32)) IS NULL OR outbox.channel = CAST(? AS VARCHAR(32))) ORDER BY outbox.next_attempt_at, outbox.message_id
 LIMIT ? OFFSET ?;

-- name: claim_messages
-- Lease the due messages, skipping rows another dispatcher has locked (PostgreSQL: due and taken
-- in one statement); each claim bumps the fence and counts the attempt.
-- parameters: status, attempts_1, fence_1, owner, lease, json_extract_1, due
UPDATE outbox SET status=?, attempts=(outbox.attempts + ?), fence=(outbox.fence + ?), lease_owner=?, lease_expires_at=(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000'), claimed_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE outbox.message_id IN (SELECT json_extract(anon_1.value, ?) AS message_id 
FROM json_each(?) AS anon_1) RETURNING message_id, run_id, channel, recipient, subject, body, headers, status, attempts, fence, lease_owner, lease_expires_at, claimed_at, next_attempt_at, last_error, provider_message_id, created_at, updated_at, sent_at;

-- name: record_delivery_outcome
-- sending -> retry, uncertain or dead, with the error and when it is due again (database clock, or
-- never); only the current delivery-lease holder can (PostgreSQL: with its delivery attempt row in
-- the same statement).
-- parameters: outcome, delay, delay, last_error, message_id, fence, owner, status_1
UPDATE outbox SET status=?, lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=CASE WHEN (CAST(? AS FLOAT) IS NULL) THEN NULL ELSE (strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ?)) || '000') END, last_error=?, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE outbox.message_id = ? AND outbox.fence = ? AND outbox.lease_owner = ? AND outbox.status = ? RETURNING message_id;

-- name: record_delivery_attempt
-- One delivery attempt row per try, unique per (message, attempt).
-- parameters: message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id
INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, finished_at, outcome, reply_code, reply_text, provider_message_id) VALUES (?, ?, ?, ?, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), ?, ?, ?, ?);

-- name: record_sent_attempts
-- The delivery attempt rows of the given messages still held under their fence and owner, before
-- they are marked sent.
-- parameters: param_1, json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, json_extract_6, sent, status_1, param_2
INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id, finished_at) SELECT outbox.message_id, outbox.attempts, given.owner, outbox.claimed_at, ? AS anon_1, given.reply_code, given.reply_text, given.provider_message_id, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') AS db_now_1 
FROM outbox, (SELECT json_extract(anon_2.value, ?) AS message_id, json_extract(anon_2.value, ?) AS fence, json_extract(anon_2.value, ?) AS owner, json_extract(anon_2.value, ?) AS reply_code, json_extract(anon_2.value, ?) AS reply_text, json_extract(anon_2.value, ?) AS provider_message_id 
FROM json_each(?) AS anon_2) AS given 
WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.lease_owner = given.owner AND (outbox.status || ?) = ?;

-- name: mark_sent
-- sending -> sent for the given messages, each only by its current delivery-lease holder
-- (PostgreSQL: with their delivery attempt rows in the same statement).
-- parameters: status, json_extract_1, json_extract_2, json_extract_3, json_extract_4, json_extract_5, json_extract_6, sent, status_1, param_1
UPDATE outbox SET status=?, lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=NULL, last_error=NULL, provider_message_id=given.provider_message_id, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), sent_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') FROM (SELECT json_extract(anon_1.value, ?) AS message_id, json_extract(anon_1.value, ?) AS fence, json_extract(anon_1.value, ?) AS owner, json_extract(anon_1.value, ?) AS reply_code, json_extract(anon_1.value, ?) AS reply_text, json_extract(anon_1.value, ?) AS provider_message_id 
FROM json_each(?) AS anon_1) AS given WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.lease_owner = given.owner AND (outbox.status || ?) = ? RETURNING message_id;

-- name: read_sent_by_claim
-- Which of the given messages are sent already by the given claim (its fence, and its attempt
-- recorded sent by its owner): a mark retried after its commit succeeded.
-- parameters: json_extract_1, json_extract_2, json_extract_3, json_extract_4, sent, status_1, outcome_1
SELECT outbox.message_id 
FROM outbox, (SELECT json_extract(anon_1.value, ?) AS message_id, json_extract(anon_1.value, ?) AS fence, json_extract(anon_1.value, ?) AS owner, json_extract(anon_1.value, ?) AS attempt 
FROM json_each(?) AS anon_1) AS given 
WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.status = ? AND (EXISTS (SELECT delivery_attempts.id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = given.message_id AND delivery_attempts.attempt = given.attempt AND delivery_attempts.owner = given.owner AND delivery_attempts.outcome = ?));

-- name: release_message
-- A claimed message never handed to a transport returns to the status it was claimed from, due
-- now, and its try is not counted; only its lease holder can.
-- parameters: status, attempts_1, message_id, fence, owner, status_1
UPDATE outbox SET status=?, attempts=(outbox.attempts - ?), lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE outbox.message_id = ? AND outbox.fence = ? AND outbox.lease_owner = ? AND outbox.status = ?;

-- name: requeue_message
-- Operator action: a retry, uncertain or dead message is due now, with the same key; no other
-- status can be requeued.
-- parameters: status, message_id, status_1, status_2, status_3
UPDATE outbox SET status=?, next_attempt_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000') WHERE outbox.message_id = ? AND (outbox.status = ? OR outbox.status = ? OR outbox.status = ?) RETURNING message_id, run_id, channel, recipient, subject, body, headers, status, attempts, fence, lease_owner, lease_expires_at, claimed_at, next_attempt_at, last_error, provider_message_id, created_at, updated_at, sent_at;

-- name: get_message
-- An outbox message by id.
-- parameters: message_id
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at 
FROM outbox 
WHERE outbox.message_id = ?;

-- name: list_messages
-- Outbox messages, oldest first, optionally of one status and one Run.
-- parameters: status, status, run_id, run_id, limit, param_1
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at 
FROM outbox 
WHERE (CAST(? AS VARCHAR(16)) IS NULL OR outbox.status = CAST(? AS VARCHAR(16))) AND (CAST(? AS VARCHAR(64)) IS NULL OR outbox.run_id = CAST(? AS VARCHAR(64))) ORDER BY outbox.created_at, outbox.message_id
 LIMIT ? OFFSET ?;

-- name: list_delivery_attempts
-- A message's delivery attempts in order.
-- parameters: message_id
SELECT delivery_attempts.id, delivery_attempts.message_id, delivery_attempts.attempt, delivery_attempts.owner, delivery_attempts.started_at, delivery_attempts.finished_at, delivery_attempts.outcome, delivery_attempts.reply_code, delivery_attempts.reply_text, delivery_attempts.provider_message_id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = ? ORDER BY delivery_attempts.attempt;

-- name: count_messages
-- Outbox messages per status.
SELECT outbox.status, count(*) AS messages 
FROM outbox GROUP BY outbox.status;

-- name: count_suppressed
-- Add one tick's Runs asked for again (completed: duplicates; leased by another worker: in
-- progress elsewhere) to its job's counts for the UTC day.
-- parameters: job, day, duplicates, in_progress_elsewhere
INSERT INTO suppressed_counts (job, day, duplicates, in_progress_elsewhere, updated_at) VALUES (?, ?, ?, ?, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')) ON CONFLICT (job, day) DO UPDATE SET duplicates = (suppressed_counts.duplicates + excluded.duplicates), in_progress_elsewhere = (suppressed_counts.in_progress_elsewhere + excluded.in_progress_elsewhere), updated_at = excluded.updated_at;

-- name: read_completed_since
-- The Runs completed from a moment on (optionally of one job): job, completion time and attempts,
-- no documents.
-- parameters: status_1, since, job, job
SELECT runs.job, runs.completed_at, runs.attempts 
FROM runs 
WHERE runs.status = ? AND runs.completed_at >= ? AND (CAST(? AS VARCHAR(200)) IS NULL OR runs.job = CAST(? AS VARCHAR(200)));

-- name: read_attempts_since
-- The Attempts started or ended from a moment on (optionally of one job's Runs): times, outcome
-- and model calls.
-- parameters: since, since, job, job
SELECT runs.job, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.model_calls 
FROM attempts JOIN runs ON runs.run_id = attempts.run_id 
WHERE (attempts.started_at >= ? OR attempts.finished_at >= ?) AND (CAST(? AS VARCHAR(200)) IS NULL OR runs.job = CAST(? AS VARCHAR(200)));

-- name: read_messages_since
-- The outbox messages queued from a moment on (optionally of one job's Runs): queue time and
-- status.
-- parameters: since, job, job
SELECT runs.job, outbox.created_at, outbox.status 
FROM outbox JOIN runs ON runs.run_id = outbox.run_id 
WHERE outbox.created_at >= ? AND (CAST(? AS VARCHAR(200)) IS NULL OR runs.job = CAST(? AS VARCHAR(200)));

-- name: read_suppressed_since
-- The suppressed counts from a UTC day on (optionally of one job).
-- parameters: day, job, job
SELECT suppressed_counts.job, suppressed_counts.day, suppressed_counts.duplicates, suppressed_counts.in_progress_elsewhere 
FROM suppressed_counts 
WHERE suppressed_counts.day >= ? AND (CAST(? AS VARCHAR(200)) IS NULL OR suppressed_counts.job = CAST(? AS VARCHAR(200)));

-- name: prune_window
-- The id of the last of the next Runs in id order after the cursor (at most limit of them): the
-- end of a prune batch's window.
-- parameters: after, limit, param_1
SELECT max(run_id) AS until 
FROM (SELECT runs.run_id AS run_id 
FROM runs 
WHERE runs.run_id > ? ORDER BY runs.run_id
 LIMIT ? OFFSET ?) AS window;

-- name: pick_prunable_runs
-- Lock the Runs of the batch's window (ids after the cursor, up to its end) that are completed
-- before the cutoff, of the given jobs, not tombstones and without an outbox message still to
-- deliver, with their outputs (to digest) and their documents' stored size.
-- parameters: after, until, status_1, cutoff, json_extract_1, jobs, status_2, status_3, status_4, status_5
SELECT runs.run_id, runs.output, coalesce(length(CAST(runs.raw_input AS BLOB)), 0) + coalesce(length(CAST(runs.output AS BLOB)), 0) + coalesce(length(CAST(runs.error AS BLOB)), 0) + coalesce(length(CAST(runs.params AS BLOB)), 0) AS document_bytes 
FROM runs 
WHERE runs.run_id > ? AND runs.run_id <= ? AND runs.status = ? AND runs.pruned_at IS NULL AND runs.completed_at < ? AND runs.job IN (SELECT json_extract(anon_1.value, ?) AS job 
FROM json_each(?) AS anon_1) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = ? OR outbox.status = ? OR outbox.status = ? OR outbox.status = ?))) ORDER BY runs.run_id;

-- name: delete_pruned_delivery_attempts
-- Delete the delivery attempts of the pruned Runs' sent and dead messages.
-- parameters: json_extract_1, ids, status_1, status_2
DELETE FROM delivery_attempts WHERE delivery_attempts.message_id IN (SELECT outbox.message_id 
FROM outbox 
WHERE outbox.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) AND (outbox.status = ? OR outbox.status = ?)) RETURNING id;

-- name: delete_pruned_messages
-- Delete the pruned Runs' sent and dead outbox rows (never a message still to deliver).
-- parameters: json_extract_1, ids, status_1, status_2
DELETE FROM outbox WHERE outbox.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) AND (outbox.status = ? OR outbox.status = ?) RETURNING message_id;

-- name: delete_pruned_attempts
-- Delete the pruned Runs' Attempts.
-- parameters: json_extract_1, ids
DELETE FROM attempts WHERE attempts.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) RETURNING attempt_id;

-- name: delete_pruned_occurrences
-- Delete the pruned Runs' alert occurrences (overdue, recovered) whose events are known emitted; a
-- skip decision is kept.
-- parameters: json_extract_1, ids
DELETE FROM occurrences WHERE occurrences.run_id IN (SELECT json_extract(anon_1.value, ?) AS run_id 
FROM json_each(?) AS anon_1) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL) RETURNING run_id;

-- name: bury_runs
-- Turn the picked completed Runs into tombstones: record their output digests and the prune time
-- (database clock), null their raw input, output, error and params; identity, status, fence,
-- fingerprint, counts and completion stay.
-- parameters: json_extract_1, json_extract_2, digests, status_1
UPDATE runs SET params=NULL, raw_input=NULL, output=NULL, error=NULL, updated_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), pruned_at=(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'), output_digest=buried.output_digest FROM (SELECT json_extract(anon_1.value, ?) AS run_id, json_extract(anon_1.value, ?) AS output_digest 
FROM json_each(?) AS anon_1) AS buried WHERE runs.run_id = buried.run_id AND runs.status = ? AND runs.pruned_at IS NULL RETURNING run_id;

-- name: count_prunable
-- What a prune pass with this cutoff and these jobs would make tombstones and delete (a dry run),
-- and the Runs from before the cutoff it leaves alone, by why.
-- parameters: status_1, cutoff, json_extract_1, jobs, status_2, status_3, status_4, status_5, coalesce_2, status_6, cutoff, json_extract_2, jobs, status_7, status_8, status_9, status_10, status_11, cutoff, json_extract_3, jobs, status_12, status_13, cutoff, json_extract_4, jobs, json_extract_5, jobs
WITH picked AS 
(SELECT runs.run_id AS run_id, coalesce(length(CAST(runs.raw_input AS BLOB)), 0) + coalesce(length(CAST(runs.output AS BLOB)), 0) + coalesce(length(CAST(runs.error AS BLOB)), 0) + coalesce(length(CAST(runs.params AS BLOB)), 0) AS size 
FROM runs 
WHERE runs.status = ? AND runs.pruned_at IS NULL AND runs.completed_at < ? AND runs.job IN (SELECT json_extract(anon_1.value, ?) AS job 
FROM json_each(?) AS anon_1) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = ? OR outbox.status = ? OR outbox.status = ? OR outbox.status = ?))))
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
FROM picked) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL)) AS occurrences, (SELECT coalesce(sum(picked.size), ?) AS coalesce_1 
FROM picked) AS document_bytes, (SELECT count(*) AS count_6 
FROM runs 
WHERE runs.status = ? AND runs.pruned_at IS NULL AND runs.completed_at < ? AND runs.job IN (SELECT json_extract(anon_2.value, ?) AS job 
FROM json_each(?) AS anon_2) AND (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = ? OR outbox.status = ? OR outbox.status = ? OR outbox.status = ?)))) AS unfinished_outbox, (SELECT count(*) AS count_7 
FROM runs 
WHERE runs.status = ? AND runs.created_at < ? AND runs.job IN (SELECT json_extract(anon_3.value, ?) AS job 
FROM json_each(?) AS anon_3)) AS failed, (SELECT count(*) AS count_8 
FROM runs 
WHERE (runs.status = ? OR runs.status = ?) AND runs.created_at < ? AND runs.job IN (SELECT json_extract(anon_4.value, ?) AS job 
FROM json_each(?) AS anon_4)) AS unfinished, (SELECT count(*) AS count_9 
FROM runs 
WHERE runs.pruned_at IS NOT NULL AND runs.job IN (SELECT json_extract(anon_5.value, ?) AS job 
FROM json_each(?) AS anon_5)) AS tombstones;

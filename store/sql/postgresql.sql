-- The SQL runledger's ledger sends to postgresql, statement by statement.
-- Written by `python -m store.sql --write`; a test fails when it is stale.

-- name: reserve_budget
-- Reserve a call's estimate in a job's budget window (creating the window with the given cap),
-- only if what is spent, what is reserved and the estimate together stay within the cap; the cap
-- given replaces the stored one (a raised cap applies at once).
-- parameters: job, scope, window_start, unit, currency, cap, estimate
INSERT INTO budget_windows (job, scope, window_start, unit, currency, cap, reserved, spent, calls, refused, updated_at) SELECT %(job)s::VARCHAR AS job, %(scope)s::VARCHAR AS scope, %(window_start)s::TIMESTAMP WITH TIME ZONE AS window_start, %(unit)s::VARCHAR AS unit, %(currency)s::VARCHAR AS currency, %(cap)s::BIGINT AS cap, %(estimate)s::BIGINT AS reserved, 0 AS spent, 1 AS calls, 0 AS refused, statement_timestamp() AS updated_at 
WHERE %(estimate)s::BIGINT <= %(cap)s::BIGINT ON CONFLICT (job, scope, window_start) DO UPDATE SET unit = excluded.unit, currency = excluded.currency, cap = excluded.cap, reserved = (budget_windows.reserved + excluded.reserved), calls = (budget_windows.calls + 1), exhausted_at = NULL, updated_at = excluded.updated_at WHERE budget_windows.spent + budget_windows.reserved + excluded.reserved <= excluded.cap RETURNING budget_windows.reserved;

-- name: refuse_budget
-- Count a call the window had no room for (creating the window if it has none yet).
-- parameters: job, scope, window_start, unit, currency, cap
INSERT INTO budget_windows (job, scope, window_start, unit, currency, cap, reserved, spent, calls, refused, updated_at) VALUES (%(job)s::VARCHAR, %(scope)s::VARCHAR, %(window_start)s::TIMESTAMP WITH TIME ZONE, %(unit)s::VARCHAR, %(currency)s::VARCHAR, %(cap)s::BIGINT, 0, 0, 0, 1, statement_timestamp()) ON CONFLICT (job, scope, window_start) DO UPDATE SET refused = (budget_windows.refused + 1), updated_at = excluded.updated_at RETURNING budget_windows.spent, budget_windows.reserved;

-- name: exhaust_budget
-- Record when the window was first found without room, unless it is recorded already (a
-- reservation that succeeds again clears it): one statement decides who says, once, that the
-- budget is exhausted.
-- parameters: job, scope, window_start
UPDATE budget_windows SET exhausted_at=statement_timestamp() WHERE budget_windows.job = %(job)s::VARCHAR AND budget_windows.scope = %(scope)s::VARCHAR AND budget_windows.window_start = %(window_start)s::TIMESTAMP WITH TIME ZONE AND budget_windows.exhausted_at IS NULL RETURNING budget_windows.exhausted_at;

-- name: settle_budget
-- Replace a call's reservation in a window by its real cost (0 to release it: a call that failed
-- or was refused; its estimate for a call lost in flight).
-- parameters: estimate, cost, job, scope, window_start
UPDATE budget_windows SET reserved=CASE WHEN (budget_windows.reserved > %(estimate)s::BIGINT) THEN budget_windows.reserved - %(estimate)s::BIGINT ELSE 0 END, spent=(budget_windows.spent + %(cost)s::BIGINT), updated_at=statement_timestamp() WHERE budget_windows.job = %(job)s::VARCHAR AND budget_windows.scope = %(scope)s::VARCHAR AND budget_windows.window_start = %(window_start)s::TIMESTAMP WITH TIME ZONE;

-- name: list_budget_windows
-- A job's budget windows from a moment on, oldest first.
-- parameters: job, since
SELECT budget_windows.job, budget_windows.scope, budget_windows.window_start, budget_windows.unit, budget_windows.currency, budget_windows.cap, budget_windows.reserved, budget_windows.spent, budget_windows.calls, budget_windows.refused, budget_windows.exhausted_at, budget_windows.updated_at 
FROM budget_windows 
WHERE budget_windows.job = %(job)s::VARCHAR AND budget_windows.window_start >= %(since)s::TIMESTAMP WITH TIME ZONE ORDER BY budget_windows.window_start, budget_windows.scope;

-- name: release_over_budget
-- A Run whose next model call the budget refused goes back to pending with the refusal as its
-- error, and the attempt it took is given back (it did nothing: reconcile re-drives it, and never
-- gives up on it for budget refusals); only the current fence holder can.
-- parameters: error, run_id, fence, owner
UPDATE runs SET status='pending', owner=NULL, lease_expires_at=NULL, attempts=CASE WHEN (runs.attempts > 0) THEN runs.attempts - 1 ELSE 0 END, error=%(error)s::VARCHAR, updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING runs.attempts, runs.status;

-- name: end_over_budget_attempt
-- The Attempt the budget refused ends released, with the refusal.
-- parameters: error, attempt_id
UPDATE attempts SET finished_at=statement_timestamp(), outcome='released', error=%(error)s::VARCHAR, model_calls=0 WHERE attempts.attempt_id = %(attempt_id)s::VARCHAR;

-- name: read_budget_unit
-- The unit of one of a job's budget windows (money or tokens), if the window exists.
-- parameters: job, scope, window_start
SELECT budget_windows.unit 
FROM budget_windows 
WHERE budget_windows.job = %(job)s::VARCHAR AND budget_windows.scope = %(scope)s::VARCHAR AND budget_windows.window_start = %(window_start)s::TIMESTAMP WITH TIME ZONE;

-- name: configure_endpoint_limit
-- Create an endpoint's limits (buckets full) or replace its configured ones; the adaptive rate
-- starts over only when the configured rate changes.
-- parameters: name, requests_per_minute, tokens_per_minute, max_concurrent
INSERT INTO endpoint_limits (name, requests_per_minute, tokens_per_minute, max_concurrent, rate, request_level, token_level, refilled_at, refusals, granted, calls, refused, updated_at) VALUES (%(name)s::VARCHAR, CAST(%(requests_per_minute)s AS FLOAT), CAST(%(tokens_per_minute)s::BIGINT AS BIGINT), %(max_concurrent)s::INTEGER, CAST(%(requests_per_minute)s AS FLOAT), CASE WHEN (CAST(%(requests_per_minute)s AS FLOAT) IS NULL) THEN 0.0 ELSE GREATEST((CAST(%(requests_per_minute)s AS FLOAT) / CAST(60.0 AS FLOAT)) * 1.0, 1.0) END, CASE WHEN (CAST(%(tokens_per_minute)s::BIGINT AS BIGINT) IS NULL) THEN 0.0 ELSE GREATEST((CAST(%(tokens_per_minute)s::BIGINT AS BIGINT) / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0) END, statement_timestamp(), 0, false, 0, 0, statement_timestamp()) ON CONFLICT (name) DO UPDATE SET requests_per_minute = excluded.requests_per_minute, tokens_per_minute = excluded.tokens_per_minute, max_concurrent = excluded.max_concurrent, rate = CASE WHEN (endpoint_limits.requests_per_minute IS NOT DISTINCT FROM excluded.requests_per_minute) THEN endpoint_limits.rate ELSE excluded.rate END, updated_at = excluded.updated_at;

-- name: lock_endpoint_limit
-- Lock an endpoint's limits row until the transaction ends.
-- parameters: name
SELECT endpoint_limits.name 
FROM endpoint_limits 
WHERE endpoint_limits.name = %(name)s::VARCHAR FOR UPDATE;

-- name: acquire_endpoint_slot
-- Refill the endpoint's buckets by the database time elapsed and take one request and the call's
-- tokens, only if the endpoint is not paused, both buckets hold them, fewer calls than its maximum
-- are in flight and no probe is awaited (knowing no rate, one call waits for its answer); the
-- levels are returned either way (how long to wait).
-- parameters: in_flight_seconds, tokens, name
UPDATE endpoint_limits SET request_level=(CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END - CASE WHEN ((endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) AND (endpoint_limits.max_concurrent IS NULL OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) < endpoint_limits.max_concurrent) AND (endpoint_limits.rate IS NULL OR CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END >= 1.0) AND (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL OR CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END >= LEAST(CAST(%(tokens)s::BIGINT AS FLOAT), (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0)) AND NOT (endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL AND endpoint_limits.probe_at IS NOT NULL AND extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < %(in_flight_seconds)s AND (extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < 1.0 OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) > 0))) THEN 1 ELSE 0 END), token_level=(CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END - CASE WHEN ((endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) AND (endpoint_limits.max_concurrent IS NULL OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) < endpoint_limits.max_concurrent) AND (endpoint_limits.rate IS NULL OR CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END >= 1.0) AND (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL OR CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END >= LEAST(CAST(%(tokens)s::BIGINT AS FLOAT), (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0)) AND NOT (endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL AND endpoint_limits.probe_at IS NOT NULL AND extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < %(in_flight_seconds)s AND (extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < 1.0 OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) > 0))) THEN 1 ELSE 0 END * %(tokens)s::BIGINT), refilled_at=statement_timestamp(), granted=((endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) AND (endpoint_limits.max_concurrent IS NULL OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) < endpoint_limits.max_concurrent) AND (endpoint_limits.rate IS NULL OR CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END >= 1.0) AND (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL OR CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END >= LEAST(CAST(%(tokens)s::BIGINT AS FLOAT), (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0)) AND NOT (endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL AND endpoint_limits.probe_at IS NOT NULL AND extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < %(in_flight_seconds)s AND (extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < 1.0 OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) > 0))), calls=(endpoint_limits.calls + CASE WHEN ((endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) AND (endpoint_limits.max_concurrent IS NULL OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) < endpoint_limits.max_concurrent) AND (endpoint_limits.rate IS NULL OR CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END >= 1.0) AND (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL OR CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END >= LEAST(CAST(%(tokens)s::BIGINT AS FLOAT), (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0)) AND NOT (endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL AND endpoint_limits.probe_at IS NOT NULL AND extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < %(in_flight_seconds)s AND (extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < 1.0 OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) > 0))) THEN 1 ELSE 0 END), updated_at=statement_timestamp(), probe_at=CASE WHEN ((endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) AND (endpoint_limits.max_concurrent IS NULL OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) < endpoint_limits.max_concurrent) AND (endpoint_limits.rate IS NULL OR CASE WHEN (endpoint_limits.rate IS NULL) THEN 0.0 ELSE LEAST(GREATEST((endpoint_limits.rate / CAST(60.0 AS FLOAT)) * 1.0, 1.0), endpoint_limits.request_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * endpoint_limits.rate) / CAST(60.0 AS FLOAT)) END >= 1.0) AND (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL OR CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), endpoint_limits.token_level + (GREATEST(extract(epoch from (statement_timestamp() - endpoint_limits.refilled_at))::float8, 0.0) * CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END) / CAST(60.0 AS FLOAT)) END >= LEAST(CAST(%(tokens)s::BIGINT AS FLOAT), (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0)) AND NOT (endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL AND endpoint_limits.probe_at IS NOT NULL AND extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < %(in_flight_seconds)s AND (extract(epoch from (statement_timestamp() - endpoint_limits.probe_at))::float8 < 1.0 OR (SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = endpoint_limits.name AND model_calls.outcome IS NULL AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -%(in_flight_seconds)s))) > 0)) AND endpoint_limits.requests_per_minute IS NULL AND endpoint_limits.tokens_per_minute IS NULL AND endpoint_limits.max_concurrent IS NULL AND endpoint_limits.rate IS NULL AND endpoint_limits.answered_at IS NULL) THEN statement_timestamp() ELSE endpoint_limits.probe_at END WHERE endpoint_limits.name = %(name)s::VARCHAR RETURNING endpoint_limits.granted, endpoint_limits.refilled_at, endpoint_limits.paused_until, endpoint_limits.rate, endpoint_limits.request_level, endpoint_limits.tokens_per_minute, endpoint_limits.announced_tokens_per_minute, endpoint_limits.token_level;

-- name: refuse_endpoint
-- The provider refused a call: pause the endpoint for every worker until the time it named (else a
-- backoff doubling per refusal), both capped, never shortening a pause; cut the rate by 30% once
-- per pause (learning one from the calls just made when none is known); give back the call's
-- tokens.
-- parameters: name, tokens, pause_seconds, max_pause_seconds
UPDATE endpoint_limits SET rate=CASE WHEN (endpoint_limits.paused_until IS NULL OR endpoint_limits.paused_until <= statement_timestamp()) THEN GREATEST(coalesce(endpoint_limits.rate, CAST((SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.endpoint = %(name)s::VARCHAR AND model_calls.started_at > (statement_timestamp() + make_interval(secs => -10.0))) AS FLOAT) * 6.0) * 0.7, 6.0) ELSE endpoint_limits.rate END, request_level=0.0, token_level=CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 ELSE endpoint_limits.token_level + %(tokens)s::BIGINT END, paused_until=GREATEST(coalesce(endpoint_limits.paused_until, statement_timestamp()), (statement_timestamp() + make_interval(secs => LEAST(coalesce(CAST(%(pause_seconds)s AS FLOAT), CASE WHEN (endpoint_limits.refusals = 0) THEN 1.0 WHEN (endpoint_limits.refusals = 1) THEN 2.0 WHEN (endpoint_limits.refusals = 2) THEN 4.0 WHEN (endpoint_limits.refusals = 3) THEN 8.0 WHEN (endpoint_limits.refusals = 4) THEN 16.0 ELSE 32.0 END), %(max_pause_seconds)s)))), refusals=(endpoint_limits.refusals + 1), refused=(endpoint_limits.refused + 1), updated_at=statement_timestamp() WHERE endpoint_limits.name = %(name)s::VARCHAR RETURNING endpoint_limits.paused_until, endpoint_limits.rate;

-- name: read_endpoint_limit
-- An endpoint's limits and their state.
-- parameters: name
SELECT endpoint_limits.name, endpoint_limits.requests_per_minute, endpoint_limits.tokens_per_minute, endpoint_limits.max_concurrent, endpoint_limits.rate, endpoint_limits.request_level, endpoint_limits.token_level, endpoint_limits.refilled_at, endpoint_limits.paused_until, endpoint_limits.refusals, endpoint_limits.granted, endpoint_limits.calls, endpoint_limits.refused, endpoint_limits.updated_at, endpoint_limits.announced_requests_per_minute, endpoint_limits.announced_tokens_per_minute, endpoint_limits.answered_at, endpoint_limits.probe_at 
FROM endpoint_limits 
WHERE endpoint_limits.name = %(name)s::VARCHAR;

-- name: settle_endpoint_call
-- An answered call settles the tokens it took to what it used, records the limits it announced,
-- and raises the endpoint's rate by its share of a second's step, up to the lower of the
-- configured and the announced rate (a rate not yet known adopts it at once); a nearly spent quota
-- pauses the endpoint, never shortening a pause.
-- parameters: announced_rpm, requests_remaining, announced_tpm, tokens_remaining, estimate, used, pause_seconds, name
UPDATE endpoint_limits SET rate=CASE WHEN (endpoint_limits.rate IS NULL) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END WHEN (CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END IS NOT NULL AND endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) > CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END ELSE endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) END, request_level=CASE WHEN (endpoint_limits.rate IS NULL AND CASE WHEN (endpoint_limits.rate IS NULL) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END WHEN (CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END IS NOT NULL AND endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) > CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END ELSE endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) END IS NOT NULL) THEN LEAST(GREATEST((CASE WHEN (endpoint_limits.rate IS NULL) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END WHEN (CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END IS NOT NULL AND endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) > CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END ELSE endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) END / CAST(60.0 AS FLOAT)) * 1.0, 1.0), coalesce(CAST(%(requests_remaining)s AS FLOAT), GREATEST((CASE WHEN (endpoint_limits.rate IS NULL) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END WHEN (CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END IS NOT NULL AND endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) > CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END) THEN CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END ELSE endpoint_limits.rate + (coalesce(CASE WHEN (endpoint_limits.requests_per_minute IS NULL) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) IS NULL) THEN endpoint_limits.requests_per_minute WHEN (coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) < endpoint_limits.requests_per_minute) THEN coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute) ELSE endpoint_limits.requests_per_minute END, endpoint_limits.rate) * 1.7999999999999998) / CAST(endpoint_limits.rate AS FLOAT) END / CAST(60.0 AS FLOAT)) * 1.0, 1.0))) ELSE endpoint_limits.request_level END, token_level=CASE WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) < endpoint_limits.tokens_per_minute) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN 0.0 WHEN (CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN endpoint_limits.announced_tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (endpoint_limits.announced_tokens_per_minute < endpoint_limits.tokens_per_minute) THEN endpoint_limits.announced_tokens_per_minute ELSE endpoint_limits.tokens_per_minute END IS NULL) THEN LEAST(GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) < endpoint_limits.tokens_per_minute) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0), coalesce(CAST(%(tokens_remaining)s AS FLOAT), GREATEST((CASE WHEN (endpoint_limits.tokens_per_minute IS NULL) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) IS NULL) THEN endpoint_limits.tokens_per_minute WHEN (coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) < endpoint_limits.tokens_per_minute) THEN coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute) ELSE endpoint_limits.tokens_per_minute END / CAST(60.0 AS DOUBLE PRECISION)) * 1.0, 1.0))) ELSE (endpoint_limits.token_level + %(estimate)s::BIGINT) - %(used)s::BIGINT END, paused_until=CASE WHEN (CAST(%(pause_seconds)s AS FLOAT) IS NULL) THEN endpoint_limits.paused_until ELSE GREATEST(coalesce(endpoint_limits.paused_until, statement_timestamp()), (statement_timestamp() + make_interval(secs => CAST(%(pause_seconds)s AS FLOAT)))) END, refusals=0, updated_at=statement_timestamp(), announced_requests_per_minute=coalesce(CAST(%(announced_rpm)s AS FLOAT), endpoint_limits.announced_requests_per_minute), announced_tokens_per_minute=coalesce(CAST(%(announced_tpm)s::BIGINT AS BIGINT), endpoint_limits.announced_tokens_per_minute), answered_at=statement_timestamp() WHERE endpoint_limits.name = %(name)s::VARCHAR;

-- name: record_call_intent
-- Record a model call before it leaves, in flight (no outcome), only while its Attempt holds the
-- Run's lease (fence, owner, database clock).
-- parameters: call_id, run_id, attempt_id, fence, endpoint, model, position, prompt_digest, estimate, budget_period, budget_day, owner
INSERT INTO model_calls (call_id, run_id, attempt_id, fence, job, endpoint, model, position, prompt_digest, started_at, estimate, budget_period, budget_day) SELECT %(call_id)s::VARCHAR AS call_id, %(run_id)s::VARCHAR AS run_id, %(attempt_id)s::VARCHAR AS attempt_id, %(fence)s::INTEGER AS fence, runs.job, %(endpoint)s::VARCHAR AS endpoint, %(model)s::VARCHAR AS model, %(position)s::INTEGER AS position, %(prompt_digest)s::VARCHAR AS prompt_digest, statement_timestamp() AS started_at, %(estimate)s::BIGINT AS estimate, %(budget_period)s::TIMESTAMP WITH TIME ZONE AS budget_period, %(budget_day)s::DATE AS budget_day 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING model_calls.call_id;

-- name: record_call_queued
-- Record a model call queued for a provider's batch (its line's id and request body) instead of
-- sent, only while its Attempt holds the Run's lease.
-- parameters: call_id, run_id, attempt_id, fence, endpoint, model, position, prompt_digest, estimate, budget_period, budget_day, custom_id, request, flow_run_id, queued_tokens, owner
INSERT INTO model_calls (call_id, run_id, attempt_id, fence, job, endpoint, model, position, prompt_digest, started_at, estimate, budget_period, budget_day, outcome, custom_id, request, flow_run_id, queued_tokens) SELECT %(call_id)s::VARCHAR AS call_id, %(run_id)s::VARCHAR AS run_id, %(attempt_id)s::VARCHAR AS attempt_id, %(fence)s::INTEGER AS fence, runs.job, %(endpoint)s::VARCHAR AS endpoint, %(model)s::VARCHAR AS model, %(position)s::INTEGER AS position, %(prompt_digest)s::VARCHAR AS prompt_digest, statement_timestamp() AS started_at, %(estimate)s::BIGINT AS estimate, %(budget_period)s::TIMESTAMP WITH TIME ZONE AS budget_period, %(budget_day)s::DATE AS budget_day, 'queued' AS outcome, %(custom_id)s::VARCHAR AS custom_id, %(request)s::JSONB AS request, %(flow_run_id)s::VARCHAR AS flow_run_id, %(queued_tokens)s::INTEGER AS queued_tokens 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING model_calls.call_id;

-- name: find_batched_call
-- The Run's call of this position and prompt that waits in a batch, or that a batch answered (its
-- answer not rejected), if it queued one already (a Run queues a call once).
-- parameters: run_id, position, prompt_digest
SELECT model_calls.call_id, model_calls.outcome 
FROM model_calls 
WHERE model_calls.run_id = %(run_id)s::VARCHAR AND model_calls.position = %(position)s::INTEGER AND model_calls.prompt_digest = %(prompt_digest)s::VARCHAR AND (model_calls.outcome = 'queued' OR model_calls.outcome = 'answered' AND model_calls.batch_key IS NOT NULL AND model_calls.rejected_at IS NULL) ORDER BY model_calls.started_at, model_calls.call_id 
 LIMIT 1;

-- name: record_call_answer
-- Record a call answered with its usage and checkpoint its answer, only while its Attempt holds
-- the Run's lease; otherwise the call is lost (another attempt may be paying for it again) and
-- only its usage is recorded.
-- parameters: run_id, owner, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, latency_ms, cost_nanos, currency, overrun, sync_cost_nanos, answer, call_id
UPDATE model_calls SET finished_at=statement_timestamp(), outcome=CASE WHEN (model_calls.outcome IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = model_calls.fence AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running'))) THEN 'answered' ELSE 'lost' END, prompt_tokens=%(prompt_tokens)s::INTEGER, completion_tokens=%(completion_tokens)s::INTEGER, cached_tokens=%(cached_tokens)s::INTEGER, cache_write_tokens=%(cache_write_tokens)s::INTEGER, latency_ms=%(latency_ms)s::INTEGER, cost_nanos=%(cost_nanos)s::BIGINT, currency=%(currency)s::VARCHAR, overrun=%(overrun)s::BIGINT, sync_cost_nanos=%(sync_cost_nanos)s::BIGINT, answer=CASE WHEN (model_calls.outcome IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = model_calls.fence AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running'))) THEN %(answer)s::JSONB ELSE NULL END WHERE model_calls.call_id = %(call_id)s::VARCHAR AND (model_calls.outcome IS NULL OR model_calls.outcome = 'lost' AND model_calls.latency_ms IS NULL) RETURNING model_calls.outcome;

-- name: record_call_failure
-- Record a call refused by the provider (an error reply: not billed) or failed (no usable answer:
-- timeout, connection lost, malformed reply), with its error; a call already marked lost learns
-- what became of it.
-- parameters: outcome, error, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, latency_ms, cost_nanos, currency, overrun, sync_cost_nanos, call_id
UPDATE model_calls SET finished_at=statement_timestamp(), outcome=%(outcome)s::VARCHAR, error=%(error)s::VARCHAR, prompt_tokens=%(prompt_tokens)s::INTEGER, completion_tokens=%(completion_tokens)s::INTEGER, cached_tokens=%(cached_tokens)s::INTEGER, cache_write_tokens=%(cache_write_tokens)s::INTEGER, latency_ms=%(latency_ms)s::INTEGER, cost_nanos=%(cost_nanos)s::BIGINT, currency=%(currency)s::VARCHAR, overrun=%(overrun)s::BIGINT, sync_cost_nanos=%(sync_cost_nanos)s::BIGINT WHERE model_calls.call_id = %(call_id)s::VARCHAR AND (model_calls.outcome IS NULL OR model_calls.outcome = 'lost' AND model_calls.latency_ms IS NULL) RETURNING model_calls.outcome;

-- name: mark_calls_lost
-- A Run's calls in flight whose Attempt no longer holds a lease (its fence moved on: taken over
-- after a crash or an expired lease; or the Run was finished or released without them) are lost:
-- counted as paid.
-- parameters: run_id
UPDATE model_calls SET finished_at=statement_timestamp(), outcome='lost' WHERE model_calls.run_id = %(run_id)s::VARCHAR AND model_calls.outcome IS NULL AND NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = model_calls.run_id AND runs.fence = model_calls.fence AND runs.status = 'running')) RETURNING model_calls.call_id, model_calls.job, model_calls.estimate, model_calls.budget_period, model_calls.budget_day;

-- name: list_model_calls
-- A Run's model calls, in the order they were made, without answers (nor queued requests).
-- parameters: run_id
SELECT model_calls.call_id, model_calls.run_id, model_calls.attempt_id, model_calls.fence, model_calls.job, model_calls.endpoint, model_calls.model, model_calls.position, model_calls.prompt_digest, model_calls.started_at, model_calls.finished_at, model_calls.outcome, model_calls.error, model_calls.prompt_tokens, model_calls.completion_tokens, model_calls.cached_tokens, model_calls.cache_write_tokens, model_calls.latency_ms, model_calls.cost_nanos, model_calls.currency, model_calls.overrun, model_calls.sync_cost_nanos, model_calls.rejected_at, model_calls.reuses, model_calls.estimate, model_calls.budget_period, model_calls.budget_day, model_calls.batch_key, model_calls.custom_id, model_calls.flow_run_id, model_calls.queued_tokens 
FROM model_calls 
WHERE model_calls.run_id = %(run_id)s::VARCHAR ORDER BY model_calls.started_at, model_calls.fence, model_calls.position;

-- name: list_model_calls_of_runs
-- The model calls of the Runs whose ids are given, without answers (nor queued requests): one
-- statement for a whole tick.
-- parameters: ids
SELECT model_calls.call_id, model_calls.run_id, model_calls.attempt_id, model_calls.fence, model_calls.job, model_calls.endpoint, model_calls.model, model_calls.position, model_calls.prompt_digest, model_calls.started_at, model_calls.finished_at, model_calls.outcome, model_calls.error, model_calls.prompt_tokens, model_calls.completion_tokens, model_calls.cached_tokens, model_calls.cache_write_tokens, model_calls.latency_ms, model_calls.cost_nanos, model_calls.currency, model_calls.overrun, model_calls.sync_cost_nanos, model_calls.rejected_at, model_calls.reuses, model_calls.estimate, model_calls.budget_period, model_calls.budget_day, model_calls.batch_key, model_calls.custom_id, model_calls.flow_run_id, model_calls.queued_tokens 
FROM model_calls 
WHERE model_calls.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) ORDER BY model_calls.run_id, model_calls.started_at, model_calls.position;

-- name: read_model_calls_since
-- The model calls started from a moment on (optionally of one job), with their Run's revision:
-- what stats and costs add up, no answers; not the calls still queued in a batch (neither in
-- flight nor paid).
-- parameters: since, job
SELECT model_calls.run_id, model_calls.job, model_calls.model, model_calls.started_at, model_calls.outcome, model_calls.prompt_tokens, model_calls.completion_tokens, model_calls.cached_tokens, model_calls.cache_write_tokens, model_calls.cost_nanos, model_calls.currency, model_calls.reuses, model_calls.rejected_at, model_calls.overrun, model_calls.batch_key, model_calls.sync_cost_nanos, runs.revision 
FROM model_calls JOIN runs ON runs.run_id = model_calls.run_id 
WHERE model_calls.started_at >= %(since)s::TIMESTAMP WITH TIME ZONE AND (model_calls.outcome IS NULL OR model_calls.outcome != 'queued') AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR model_calls.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: replay_call
-- The checkpointed answer of a position of the Run's transform whose prompt has the same digest
-- (not one validation rejected), counted as reused; only for the Attempt holding the Run's lease.
-- parameters: run_id, position, prompt_digest, fence, owner
UPDATE model_calls SET reuses=(model_calls.reuses + 1) WHERE model_calls.call_id = (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = %(run_id)s::VARCHAR AND model_calls.position = %(position)s::INTEGER AND model_calls.prompt_digest = %(prompt_digest)s::VARCHAR AND model_calls.outcome = 'answered' AND model_calls.answer IS NOT NULL AND model_calls.rejected_at IS NULL ORDER BY model_calls.started_at DESC, model_calls.call_id 
 LIMIT 1) AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running')) RETURNING model_calls.call_id, model_calls.answer;

-- name: reject_answers
-- Validation rejected the Run's candidate: its checkpointed answers are kept as evidence and never
-- replayed; only the holder of the Run's lease can.
-- parameters: run_id, fence, owner
UPDATE model_calls SET rejected_at=statement_timestamp() WHERE model_calls.run_id = %(run_id)s::VARCHAR AND model_calls.outcome = 'answered' AND model_calls.rejected_at IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running')) RETURNING model_calls.call_id;

-- name: count_saved
-- Add what the duplicates one tick suppressed would have cost to the job's counts for the UTC day:
-- each duplicate Run's answered calls' tokens and money, per currency (the answers a rerun would
-- pay for again; a lost or failed call of an earlier attempt is not repeated by one).
-- parameters: job, day, ids
INSERT INTO suppressed_costs (job, day, currency, runs, calls, tokens, cost_nanos, updated_at) SELECT %(job)s::VARCHAR AS job, %(day)s::DATE AS day, coalesce(model_calls.currency, '') AS currency, count(DISTINCT model_calls.run_id) AS runs, count(*) AS calls, coalesce(sum(coalesce(model_calls.prompt_tokens, 0) + coalesce(model_calls.completion_tokens, 0)), 0) AS tokens, coalesce(sum(model_calls.cost_nanos), 0) AS cost_nanos, statement_timestamp() AS updated_at 
FROM model_calls JOIN (SELECT given.run_id AS run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AS given ON model_calls.run_id = given.run_id 
WHERE model_calls.outcome = 'answered' GROUP BY coalesce(model_calls.currency, '') ON CONFLICT (job, day, currency) DO UPDATE SET runs = (suppressed_costs.runs + excluded.runs), calls = (suppressed_costs.calls + excluded.calls), tokens = (suppressed_costs.tokens + excluded.tokens), cost_nanos = (suppressed_costs.cost_nanos + excluded.cost_nanos), updated_at = excluded.updated_at;

-- name: read_saved_since
-- What suppressed duplicates would have cost, from a UTC day on (optionally of one job).
-- parameters: day, job
SELECT suppressed_costs.job, suppressed_costs.day, suppressed_costs.currency, suppressed_costs.runs, suppressed_costs.calls, suppressed_costs.tokens, suppressed_costs.cost_nanos 
FROM suppressed_costs 
WHERE suppressed_costs.day >= %(day)s::DATE AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR suppressed_costs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: read_clock
-- The database clock, which every lease and due time is judged by.
SELECT statement_timestamp() AS now;

-- name: find_run_ids
-- The first Run ids in the range a prefix spans, and how many there are.
-- parameters: low, high
SELECT runs.run_id AS id, count(*) OVER () AS matches 
FROM runs 
WHERE runs.run_id BETWEEN %(low)s::VARCHAR AND %(high)s::VARCHAR ORDER BY runs.run_id 
 LIMIT 5;

-- name: find_message_ids
-- The first outbox message ids in the range a prefix spans, and how many there are.
-- parameters: low, high
SELECT outbox.message_id AS id, count(*) OVER () AS matches 
FROM outbox 
WHERE outbox.message_id BETWEEN %(low)s::VARCHAR AND %(high)s::VARCHAR ORDER BY outbox.message_id 
 LIMIT 5;

-- name: owe_subjects
-- Record from which period a job owes each given subject, once: a subject already recorded keeps
-- its first value.
-- parameters: owed
INSERT INTO obligations (job, subject, owed_from, created_at) SELECT given.job, given.subject, given.owed_from, statement_timestamp() AS created_at 
FROM (SELECT given.job AS job, given.subject AS subject, given.owed_from AS owed_from 
FROM jsonb_to_recordset(%(owed)s::JSONB) AS given(job VARCHAR(200), subject VARCHAR(500), owed_from TIMESTAMP WITH TIME ZONE)) AS given 
WHERE true ON CONFLICT DO NOTHING;

-- name: read_obligations
-- The subjects a job owes and the period each is owed from.
-- parameters: job
SELECT obligations.subject, obligations.owed_from 
FROM obligations 
WHERE obligations.job = %(job)s::VARCHAR ORDER BY obligations.subject;

-- name: skip_occurrences
-- Record each given occurrence as skipped by the missed-run policy, with its reason, unless a Run
-- of it exists (started occurrences are re-driven, never skipped) or it is skipped already.
-- parameters: occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, skip_reason, skipped_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, given.skip_reason, statement_timestamp() AS skipped_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.skip_reason AS skip_reason 
FROM jsonb_to_recordset(%(occurrences)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), skip_reason TEXT)) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id)) ON CONFLICT (run_id) DO UPDATE SET skipped_at = excluded.skipped_at, skip_reason = excluded.skip_reason, updated_at = excluded.updated_at, skip_emitted_at = NULL WHERE occurrences.skipped_at IS NULL RETURNING occurrences.run_id;

-- name: unskip_occurrences
-- An operator runs skipped occurrences on purpose: their skip is cleared (the reason stays until
-- it runs).
-- parameters: ids
UPDATE occurrences SET skipped_at=NULL, updated_at=statement_timestamp() WHERE occurrences.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND occurrences.skipped_at IS NOT NULL RETURNING occurrences.run_id;

-- name: mark_overdue
-- Report each given occurrence overdue once: not if its Run completed, it was skipped by policy or
-- it was reported already.
-- parameters: occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, overdue_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, statement_timestamp() AS overdue_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version 
FROM jsonb_to_recordset(%(occurrences)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100))) AS given 
WHERE NOT (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = given.run_id AND runs.status = 'completed')) ON CONFLICT (run_id) DO UPDATE SET overdue_at = excluded.overdue_at, updated_at = excluded.updated_at WHERE occurrences.overdue_at IS NULL AND occurrences.skipped_at IS NULL RETURNING occurrences.run_id;

-- name: mark_recovered
-- An overdue occurrence of the job whose Run has since completed is reported recovered, once.
-- parameters: job
UPDATE occurrences SET recovered_at=statement_timestamp(), updated_at=statement_timestamp() WHERE occurrences.job = %(job)s::VARCHAR AND occurrences.overdue_at IS NOT NULL AND occurrences.recovered_at IS NULL AND (EXISTS (SELECT runs.run_id 
FROM runs 
WHERE runs.run_id = occurrences.run_id AND runs.status = 'completed')) RETURNING occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until;

-- name: give_up_run
-- A stranded Run (pending, or running on an expired lease) that used up its attempts fails for
-- good, naming its last error; a live or finished Run is left alone.
-- parameters: error, run_id, max_attempts
UPDATE runs SET status='failed', owner=NULL, lease_expires_at=NULL, error=%(error)s::VARCHAR, updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.attempts >= %(max_attempts)s::INTEGER AND (runs.status = 'pending' OR runs.status = 'running' AND runs.lease_expires_at <= statement_timestamp()) RETURNING runs.job, runs.subject, runs.period_start, runs.version;

-- name: record_give_up
-- A Run given up is recorded on its occurrence (a new give-up after an operator's requeue is a new
-- decision, its event not emitted yet).
-- parameters: occurrences
INSERT INTO occurrences (run_id, job, subject, period_start, version, gave_up_at, created_at, updated_at) SELECT given.run_id, given.job, given.subject, given.period_start, given.version, statement_timestamp() AS gave_up_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version 
FROM jsonb_to_recordset(%(occurrences)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100))) AS given 
WHERE true ON CONFLICT (run_id) DO UPDATE SET updated_at = excluded.updated_at, gave_up_at = excluded.gave_up_at, gave_up_emitted_at = NULL;

-- name: claim_decision_events
-- Lease the job's occurrences that have a decision whose event is not known to be emitted, unless
-- another pass holds them on a live lease (database clock).
-- parameters: lease, job
UPDATE occurrences SET emitting_until=(statement_timestamp() + make_interval(secs => %(lease)s)) WHERE occurrences.job = %(job)s::VARCHAR AND (occurrences.skipped_at IS NOT NULL AND occurrences.skip_emitted_at IS NULL OR occurrences.overdue_at IS NOT NULL AND occurrences.overdue_emitted_at IS NULL OR occurrences.recovered_at IS NOT NULL AND occurrences.recovered_emitted_at IS NULL OR occurrences.gave_up_at IS NOT NULL AND occurrences.gave_up_emitted_at IS NULL) AND (occurrences.emitting_until IS NULL OR occurrences.emitting_until <= statement_timestamp()) RETURNING occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until;

-- name: mark_decision_events_emitted
-- The given decisions' events were handed to the Prefect server: each is recorded emitted (if it
-- is still the decision made then), and the lease is given back.
-- parameters: emitted
UPDATE occurrences SET skip_emitted_at=CASE WHEN (occurrences.skipped_at = given.skipped_at) THEN statement_timestamp() ELSE occurrences.skip_emitted_at END, overdue_emitted_at=CASE WHEN (occurrences.overdue_at = given.overdue_at) THEN statement_timestamp() ELSE occurrences.overdue_emitted_at END, recovered_emitted_at=CASE WHEN (occurrences.recovered_at = given.recovered_at) THEN statement_timestamp() ELSE occurrences.recovered_emitted_at END, gave_up_emitted_at=CASE WHEN (occurrences.gave_up_at = given.gave_up_at) THEN statement_timestamp() ELSE occurrences.gave_up_emitted_at END, emitting_until=NULL FROM (SELECT given.run_id AS run_id, given.skipped_at AS skipped_at, given.overdue_at AS overdue_at, given.recovered_at AS recovered_at, given.gave_up_at AS gave_up_at 
FROM jsonb_to_recordset(%(emitted)s::JSONB) AS given(run_id VARCHAR(64), skipped_at TIMESTAMP WITH TIME ZONE, overdue_at TIMESTAMP WITH TIME ZONE, recovered_at TIMESTAMP WITH TIME ZONE, gave_up_at TIMESTAMP WITH TIME ZONE)) AS given WHERE occurrences.run_id = given.run_id;

-- name: read_run_states
-- Where each Run of a job stands from a period on (no documents), with whether its lease expired
-- by the database clock; revision 0 only, what the job owes (a revision is an operator's, resumed
-- by its own revise flow run).
-- parameters: job, since
SELECT runs.run_id, runs.subject, runs.period_start, runs.version, runs.status, runs.attempts, runs.model_calls, runs.updated_at, runs.error, coalesce(runs.lease_expires_at <= statement_timestamp(), false) AS lease_expired 
FROM runs 
WHERE runs.job = %(job)s::VARCHAR AND runs.period_start >= %(since)s::TIMESTAMP WITH TIME ZONE AND runs.revision = 0 ORDER BY runs.period_start, runs.subject;

-- name: read_occurrences
-- The decisions and alerts about a job's occurrences from a period on.
-- parameters: job, since
SELECT occurrences.run_id, occurrences.job, occurrences.subject, occurrences.period_start, occurrences.version, occurrences.skipped_at, occurrences.skip_reason, occurrences.overdue_at, occurrences.recovered_at, occurrences.created_at, occurrences.updated_at, occurrences.gave_up_at, occurrences.skip_emitted_at, occurrences.overdue_emitted_at, occurrences.recovered_emitted_at, occurrences.gave_up_emitted_at, occurrences.emitting_until 
FROM occurrences 
WHERE occurrences.job = %(job)s::VARCHAR AND occurrences.period_start >= %(since)s::TIMESTAMP WITH TIME ZONE ORDER BY occurrences.period_start, occurrences.subject;

-- name: claim_messages
-- Lease the due messages, skipping rows another dispatcher has locked (PostgreSQL: due and taken
-- in one statement); each claim bumps the fence and counts the attempt.
-- parameters: channel, limit, owner, lease
WITH due AS 
(SELECT outbox.message_id AS message_id, outbox.status AS status 
FROM outbox 
WHERE status IN ('pending', 'retry', 'uncertain', 'sending') AND outbox.next_attempt_at <= statement_timestamp() AND (outbox.status != 'sending' OR outbox.lease_expires_at <= statement_timestamp()) AND (CAST(%(channel)s::VARCHAR AS VARCHAR(32)) IS NULL OR outbox.channel = CAST(%(channel)s::VARCHAR AS VARCHAR(32))) ORDER BY outbox.next_attempt_at, outbox.message_id 
 LIMIT %(limit)s::INTEGER FOR UPDATE SKIP LOCKED)
 UPDATE outbox SET status='sending', attempts=(outbox.attempts + 1), fence=(outbox.fence + 1), lease_owner=%(owner)s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)), claimed_at=statement_timestamp(), updated_at=statement_timestamp() FROM due WHERE outbox.message_id = due.message_id RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason, due.status AS previous_status;

-- name: record_delivery_outcome
-- sending -> retry, uncertain or dead, with the error and when it is due again (database clock, or
-- never); only the current delivery-lease holder can (PostgreSQL: with its delivery attempt row in
-- the same statement).
-- parameters: outcome, delay, last_error, message_id, fence, owner, attempt, started_at, reply_code, reply_text, provider_message_id
WITH updated AS 
(UPDATE outbox SET status=%(outcome)s::VARCHAR, lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=CASE WHEN (CAST(%(delay)s AS FLOAT) IS NULL) THEN NULL ELSE (statement_timestamp() + make_interval(secs => %(delay)s)) END, last_error=%(last_error)s::VARCHAR, updated_at=statement_timestamp() WHERE outbox.message_id = %(message_id)s::VARCHAR AND outbox.fence = %(fence)s::INTEGER AND outbox.lease_owner = %(owner)s::VARCHAR AND outbox.status = 'sending' RETURNING outbox.message_id), 
recorded AS 
(INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id, finished_at) SELECT %(message_id)s::VARCHAR AS message_id, %(attempt)s::INTEGER AS attempt, %(owner)s::VARCHAR AS owner, %(started_at)s::TIMESTAMP WITH TIME ZONE AS started_at, %(outcome)s::VARCHAR AS outcome, %(reply_code)s::INTEGER AS reply_code, %(reply_text)s::VARCHAR AS reply_text, %(provider_message_id)s::VARCHAR AS provider_message_id, statement_timestamp() AS finished_at 
WHERE EXISTS (SELECT updated.message_id 
FROM updated))
 SELECT updated.message_id 
FROM updated;

-- name: mark_sent
-- sending -> sent for the given messages, each only by its current delivery-lease holder
-- (PostgreSQL: with their delivery attempt rows in the same statement).
-- parameters: sent
WITH given AS 
(SELECT given.message_id AS message_id, given.fence AS fence, given.owner AS owner, given.reply_code AS reply_code, given.reply_text AS reply_text, given.provider_message_id AS provider_message_id 
FROM jsonb_to_recordset(%(sent)s::JSONB) AS given(message_id VARCHAR(64), fence INTEGER, owner VARCHAR(300), reply_code INTEGER, reply_text TEXT, provider_message_id VARCHAR(300))), 
updated AS 
(UPDATE outbox SET status='sent', lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=NULL, last_error=NULL, provider_message_id=given.provider_message_id, updated_at=statement_timestamp(), sent_at=statement_timestamp() FROM given WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.lease_owner = given.owner AND (outbox.status || '') = 'sending' AND outbox.message_id = ANY (array((SELECT given.message_id 
FROM given))) RETURNING outbox.message_id, outbox.attempts, outbox.claimed_at, given.owner, given.reply_code, given.reply_text, given.provider_message_id), 
recorded AS 
(INSERT INTO delivery_attempts (message_id, attempt, owner, started_at, outcome, reply_code, reply_text, provider_message_id, finished_at) SELECT updated.message_id AS message_id, updated.attempts AS attempt, updated.owner AS owner, updated.claimed_at AS started_at, 'sent' AS outcome, updated.reply_code AS reply_code, updated.reply_text AS reply_text, updated.provider_message_id AS provider_message_id, statement_timestamp() AS finished_at 
FROM updated)
 SELECT updated.message_id 
FROM updated;

-- name: read_sent_by_claim
-- Which of the given messages are sent already by the given claim (its fence, and its attempt
-- recorded sent by its owner): a mark retried after its commit succeeded.
-- parameters: sent
SELECT outbox.message_id 
FROM outbox, (SELECT given.message_id AS message_id, given.fence AS fence, given.owner AS owner, given.attempt AS attempt 
FROM jsonb_to_recordset(%(sent)s::JSONB) AS given(message_id VARCHAR(64), fence INTEGER, owner VARCHAR(300), attempt INTEGER)) AS given 
WHERE outbox.message_id = given.message_id AND outbox.fence = given.fence AND outbox.status = 'sent' AND (EXISTS (SELECT delivery_attempts.id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = given.message_id AND delivery_attempts.attempt = given.attempt AND delivery_attempts.owner = given.owner AND delivery_attempts.outcome = 'sent'));

-- name: release_message
-- A claimed message never handed to a transport returns to the status it was claimed from, due
-- now, and its try is not counted; only its lease holder can.
-- parameters: status, message_id, fence, owner
UPDATE outbox SET status=%(status)s::VARCHAR, attempts=(outbox.attempts - 1), lease_owner=NULL, lease_expires_at=NULL, next_attempt_at=statement_timestamp(), updated_at=statement_timestamp() WHERE outbox.message_id = %(message_id)s::VARCHAR AND outbox.fence = %(fence)s::INTEGER AND outbox.lease_owner = %(owner)s::VARCHAR AND outbox.status = 'sending';

-- name: requeue_message
-- Operator action: a retry, uncertain or dead message is due now, with the same key; no other
-- status can be requeued.
-- parameters: message_id
UPDATE outbox SET status='pending', next_attempt_at=statement_timestamp(), updated_at=statement_timestamp() WHERE outbox.message_id = %(message_id)s::VARCHAR AND (outbox.status = 'retry' OR outbox.status = 'uncertain' OR outbox.status = 'dead') RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason;

-- name: get_message
-- An outbox message by id.
-- parameters: message_id
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason 
FROM outbox 
WHERE outbox.message_id = %(message_id)s::VARCHAR;

-- name: list_messages
-- Outbox messages, oldest first, optionally of one status, one Run and one channel.
-- parameters: status, run_id, channel, limit
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason 
FROM outbox 
WHERE (CAST(%(status)s::VARCHAR AS VARCHAR(16)) IS NULL OR outbox.status = CAST(%(status)s::VARCHAR AS VARCHAR(16))) AND (CAST(%(run_id)s::VARCHAR AS VARCHAR(64)) IS NULL OR outbox.run_id = CAST(%(run_id)s::VARCHAR AS VARCHAR(64))) AND (CAST(%(channel)s::VARCHAR AS VARCHAR(32)) IS NULL OR outbox.channel = CAST(%(channel)s::VARCHAR AS VARCHAR(32))) ORDER BY outbox.created_at, outbox.message_id 
 LIMIT %(limit)s::INTEGER;

-- name: list_recent_messages
-- The newest outbox messages first, optionally of one status, one Run and one channel.
-- parameters: status, run_id, channel, limit
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason 
FROM outbox 
WHERE (CAST(%(status)s::VARCHAR AS VARCHAR(16)) IS NULL OR outbox.status = CAST(%(status)s::VARCHAR AS VARCHAR(16))) AND (CAST(%(run_id)s::VARCHAR AS VARCHAR(64)) IS NULL OR outbox.run_id = CAST(%(run_id)s::VARCHAR AS VARCHAR(64))) AND (CAST(%(channel)s::VARCHAR AS VARCHAR(32)) IS NULL OR outbox.channel = CAST(%(channel)s::VARCHAR AS VARCHAR(32))) ORDER BY outbox.created_at DESC, outbox.message_id DESC 
 LIMIT %(limit)s::INTEGER;

-- name: list_delivery_attempts
-- A message's delivery attempts in order.
-- parameters: message_id
SELECT delivery_attempts.id, delivery_attempts.message_id, delivery_attempts.attempt, delivery_attempts.owner, delivery_attempts.started_at, delivery_attempts.finished_at, delivery_attempts.outcome, delivery_attempts.reply_code, delivery_attempts.reply_text, delivery_attempts.provider_message_id 
FROM delivery_attempts 
WHERE delivery_attempts.message_id = %(message_id)s::VARCHAR ORDER BY delivery_attempts.attempt;

-- name: count_messages
-- Outbox messages per status.
SELECT outbox.status, count(*) AS messages 
FROM outbox GROUP BY outbox.status;

-- name: decide_held_messages
-- A person's decision on held messages: approved ones become pending, due now with their key;
-- rejected ones are rejected, never sent; who, when and why are recorded; only a held message can
-- be decided.
-- parameters: status, decision, decided_by, decision_reason, decided
UPDATE outbox SET status=%(status)s::VARCHAR, next_attempt_at=statement_timestamp(), updated_at=statement_timestamp(), decision=%(decision)s::VARCHAR, decided_by=%(decided_by)s::VARCHAR, decided_at=statement_timestamp(), decision_reason=%(decision_reason)s::VARCHAR WHERE outbox.message_id IN (SELECT given.message_id 
FROM jsonb_to_recordset(%(decided)s::JSONB) AS given(message_id VARCHAR(64))) AND outbox.status = 'held' RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason;

-- name: read_message_statuses
-- The status of each of the given outbox messages that exists.
-- parameters: given
SELECT outbox.message_id, outbox.status 
FROM outbox 
WHERE outbox.message_id IN (SELECT given.message_id 
FROM jsonb_to_recordset(%(given)s::JSONB) AS given(message_id VARCHAR(64)));

-- name: reject_overdue_holds
-- The job's held messages whose deadline passed (database clock) are rejected, by the deadline;
-- never sent.
-- parameters: job
UPDATE outbox SET status='rejected', updated_at=statement_timestamp(), decision='rejected', decided_by='deadline', decided_at=statement_timestamp(), decision_reason='no decision before the hold''s deadline (the job''s approval rejects then)' WHERE outbox.status = 'held' AND outbox.hold_until <= statement_timestamp() AND outbox.run_id IN (SELECT runs.run_id 
FROM runs 
WHERE runs.job = %(job)s::VARCHAR) RETURNING outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason;

-- name: list_held_messages
-- Held messages, oldest first, with their Run's job, subject, period and revision, optionally of
-- one job and one Run.
-- parameters: job, run_id, limit
SELECT outbox.message_id, outbox.run_id, outbox.channel, outbox.recipient, outbox.subject, outbox.body, outbox.headers, outbox.payload, outbox.status, outbox.attempts, outbox.fence, outbox.lease_owner, outbox.lease_expires_at, outbox.claimed_at, outbox.next_attempt_at, outbox.last_error, outbox.provider_message_id, outbox.created_at, outbox.updated_at, outbox.sent_at, outbox.hold_until, outbox.decision, outbox.decided_by, outbox.decided_at, outbox.decision_reason, runs.job AS run_job, runs.subject AS run_subject, runs.period_start AS run_period_start, runs.revision AS run_revision 
FROM outbox JOIN runs ON runs.run_id = outbox.run_id 
WHERE outbox.status = 'held' AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200))) AND (CAST(%(run_id)s::VARCHAR AS VARCHAR(64)) IS NULL OR outbox.run_id = CAST(%(run_id)s::VARCHAR AS VARCHAR(64))) ORDER BY outbox.created_at, outbox.message_id 
 LIMIT %(limit)s::INTEGER;

-- name: get_run
-- A Run by id.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id = %(run_id)s::VARCHAR;

-- name: get_runs
-- Many Runs by id.
-- parameters: ids
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64)));

-- name: get_finished_runs
-- What a rerun needs of the completed and failed Runs among the given ids, and of their later
-- completed revisions (the caller keeps the latest): not their raw inputs, which can be large.
-- parameters: ids
SELECT asked.run_id AS asked_id, runs.run_id, runs.status, runs.params_fingerprint, runs.attempts, runs.output, runs.error, runs.revision, runs.pruned_at, runs.output_digest 
FROM runs AS asked JOIN runs ON runs.job = asked.job AND runs.subject = asked.subject AND runs.period_start = asked.period_start AND runs.version = asked.version 
WHERE asked.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND (runs.revision = asked.revision AND (runs.status = 'completed' OR runs.status = 'failed') OR runs.revision > asked.revision AND runs.status = 'completed');

-- name: list_runs
-- The latest Runs, newest period first, optionally of one job and one status.
-- parameters: job, status, limit
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200))) AND (CAST(%(status)s::VARCHAR AS VARCHAR(16)) IS NULL OR runs.status = CAST(%(status)s::VARCHAR AS VARCHAR(16))) ORDER BY runs.period_start DESC, runs.subject 
 LIMIT %(limit)s::INTEGER;

-- name: list_unfinished_runs
-- Every Run neither completed nor failed (pending, running or waiting for its batch), optionally
-- of one job, oldest period first, with its lease (owner, end) and fence: what on-call reads,
-- without documents.
-- parameters: job
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.revision, runs.status, runs.owner, runs.lease_expires_at, runs.fence, runs.attempts, runs.error, runs.updated_at 
FROM runs 
WHERE (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200))) AND (runs.status = 'pending' OR runs.status = 'running' OR runs.status = 'waiting') ORDER BY runs.period_start, runs.job, runs.subject, runs.revision;

-- name: list_attempts
-- A Run's Attempts in claim (fence) order.
-- parameters: run_id
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id = %(run_id)s::VARCHAR ORDER BY attempts.fence;

-- name: list_attempts_of_runs
-- The Attempts of the Runs whose ids are given, per Run in claim (fence) order: one statement for
-- a whole list of Runs.
-- parameters: ids
SELECT attempts.attempt_id, attempts.run_id, attempts.owner, attempts.fence, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.error, attempts.model_calls 
FROM attempts 
WHERE attempts.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) ORDER BY attempts.run_id, attempts.fence;

-- name: register_run
-- Insert the Run as pending, once per identity: an existing Run is left as it is (its parameters
-- are compared by the caller).
-- parameters: run_id, job, subject, period_start, version, params_fingerprint, params
INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, attempts, created_at, updated_at) VALUES (%(run_id)s::VARCHAR, %(job)s::VARCHAR, %(subject)s::VARCHAR, %(period_start)s::TIMESTAMP WITH TIME ZONE, %(version)s::VARCHAR, %(params_fingerprint)s::VARCHAR, %(params)s::JSONB, 'pending', 0, 0, statement_timestamp(), statement_timestamp()) ON CONFLICT DO NOTHING RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: claim_run
-- Take the lease of an unfinished Run whose lease is free, expired (database clock) or ours: bump
-- the fence, count the attempt (PostgreSQL: and end the previous holder's Attempt and open this
-- one's in the same statement).
-- parameters: owner, lease, run_id, attempt_id
WITH taken AS 
(UPDATE runs SET status='running', fence=(runs.fence + 1), owner=%(owner)s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)), attempts=(runs.attempts + 1), updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND (runs.status = 'pending' OR runs.status = 'running') AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = %(owner)s::VARCHAR) RETURNING runs.run_id, runs.fence, runs.lease_expires_at), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome='expired' FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT %(attempt_id)s::VARCHAR AS attempt_id, taken.run_id AS run_id, %(owner)s::VARCHAR AS owner, taken.fence AS fence, statement_timestamp() AS started_at 
FROM taken)
 SELECT taken.run_id, taken.fence, taken.lease_expires_at 
FROM taken;

-- name: enter_run
-- Register and claim one Run, given as one JSON object, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: owner, lease, runs
WITH taken AS 
(INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, 'running' AS status, 1 AS fence, %(owner)s::VARCHAR AS owner, 1 AS attempts, (statement_timestamp() + make_interval(secs => %(lease)s)) AS lease_expires_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_record(%(runs)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given 
WHERE true ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = 'running', fence = (runs.fence + 1), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + 1), updated_at = excluded.updated_at WHERE (runs.status = 'pending' OR runs.status = 'running') AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome='expired' FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT given.attempt_id AS attempt_id, taken.run_id AS run_id, taken.owner AS owner, taken.fence AS fence, statement_timestamp() AS started_at 
FROM taken JOIN (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_record(%(runs)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given ON taken.run_id = given.run_id)
 SELECT taken.run_id, taken.job, taken.subject, taken.period_start, taken.version, taken.params_fingerprint, taken.params, taken.status, taken.fence, taken.owner, taken.lease_expires_at, taken.attempts, taken.raw_input, taken.output, taken.error, taken.completed_attempt_id, taken.completed_flow_run_id, taken.completed_task_run_id, taken.model_calls, taken.created_at, taken.updated_at, taken.completed_at, taken.revision, taken.revises_run_id, taken.revision_reason, taken.resend, taken.requested_by, taken.pruned_at, taken.output_digest 
FROM taken;

-- name: enter_runs
-- Register and claim a tick's Runs, given as one JSON array, in one upsert: a new Run is inserted
-- claimed; an existing one is claimed only if it is claimable (as claim_run) and has the same
-- parameters fingerprint (PostgreSQL: with its Attempt rows in the same statement).
-- parameters: owner, lease, runs
WITH taken AS 
(INSERT INTO runs (run_id, job, subject, period_start, version, params_fingerprint, params, status, fence, owner, attempts, lease_expires_at, created_at, updated_at) SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, 'running' AS status, 1 AS fence, %(owner)s::VARCHAR AS owner, 1 AS attempts, (statement_timestamp() + make_interval(secs => %(lease)s)) AS lease_expires_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_recordset(%(runs)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given 
WHERE true ORDER BY given.run_id ON CONFLICT (run_id) DO UPDATE SET status = 'running', fence = (runs.fence + 1), owner = excluded.owner, lease_expires_at = excluded.lease_expires_at, attempts = (runs.attempts + 1), updated_at = excluded.updated_at WHERE (runs.status = 'pending' OR runs.status = 'running') AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at <= statement_timestamp() OR runs.owner = excluded.owner) AND runs.params_fingerprint = excluded.params_fingerprint RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
closed AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome='expired' FROM taken WHERE attempts.run_id = taken.run_id AND attempts.finished_at IS NULL), 
opened AS 
(INSERT INTO attempts (attempt_id, run_id, owner, fence, started_at) SELECT given.attempt_id AS attempt_id, taken.run_id AS run_id, taken.owner AS owner, taken.fence AS fence, statement_timestamp() AS started_at 
FROM taken JOIN (SELECT given.run_id AS run_id, given.job AS job, given.subject AS subject, given.period_start AS period_start, given.version AS version, given.params_fingerprint AS params_fingerprint, given.params AS params, given.attempt_id AS attempt_id 
FROM jsonb_to_recordset(%(runs)s::JSONB) AS given(run_id VARCHAR(64), job VARCHAR(200), subject VARCHAR(500), period_start TIMESTAMP WITH TIME ZONE, version VARCHAR(100), params_fingerprint VARCHAR(64), params JSONB, attempt_id VARCHAR(36))) AS given ON taken.run_id = given.run_id)
 SELECT taken.run_id, taken.job, taken.subject, taken.period_start, taken.version, taken.params_fingerprint, taken.params, taken.status, taken.fence, taken.owner, taken.lease_expires_at, taken.attempts, taken.raw_input, taken.output, taken.error, taken.completed_attempt_id, taken.completed_flow_run_id, taken.completed_task_run_id, taken.model_calls, taken.created_at, taken.updated_at, taken.completed_at, taken.revision, taken.revises_run_id, taken.revision_reason, taken.resend, taken.requested_by, taken.pruned_at, taken.output_digest 
FROM taken;

-- name: renew_leases
-- Extend the lease of every given Run still held under its fence and owner, from the database
-- clock; a Run whose fence moved on is left out.
-- parameters: lease, claims
UPDATE runs SET lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)), updated_at=statement_timestamp() WHERE (runs.run_id, runs.fence, runs.owner) IN (SELECT given.run_id, given.fence, given.owner 
FROM jsonb_to_recordset(%(claims)s::JSONB) AS given(run_id VARCHAR(64), fence INTEGER, owner VARCHAR(300))) AND runs.status = 'running' RETURNING runs.run_id, runs.lease_expires_at;

-- name: save_input
-- Store the raw input once (the first writer's value stays) and return the stored one; only the
-- current fence holder can.
-- parameters: raw_input, run_id, fence, owner
UPDATE runs SET raw_input=coalesce(runs.raw_input, %(raw_input)s::JSONB), updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING runs.raw_input;

-- name: complete_run
-- Accept the output, clear the lease, add the Attempt's model calls and record the flow run and
-- task run that completed it; only the current fence holder can (PostgreSQL: with the outbox rows
-- and the Attempt's end in the same statement, written only if the Run was accepted).
-- parameters: output, attempt_id, completed_flow_run_id, completed_task_run_id, model_calls, run_id, fence, owner, outcome, error, messages
WITH accepted AS 
(UPDATE runs SET status='completed', owner=NULL, lease_expires_at=NULL, output=%(output)s::JSONB, error=NULL, completed_attempt_id=%(attempt_id)s::VARCHAR, completed_flow_run_id=%(completed_flow_run_id)s::VARCHAR, completed_task_run_id=%(completed_task_run_id)s::VARCHAR, model_calls=(runs.model_calls + %(model_calls)s::INTEGER), updated_at=statement_timestamp(), completed_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest), 
finished AS 
(UPDATE attempts SET finished_at=statement_timestamp(), outcome=%(outcome)s::VARCHAR, error=%(error)s::VARCHAR, model_calls=%(model_calls)s::INTEGER WHERE attempts.attempt_id = %(attempt_id)s::VARCHAR AND (EXISTS (SELECT accepted.run_id 
FROM accepted))), 
queued AS 
(INSERT INTO outbox (message_id, run_id, channel, recipient, subject, body, headers, payload, status, attempts, fence, next_attempt_at, created_at, updated_at, hold_until) SELECT given.message_id AS message_id, given.run_id AS run_id, given.channel AS channel, given.recipient AS recipient, given.subject AS subject, given.body AS body, given.headers AS headers, given.payload AS payload, given.status AS status, 0 AS attempts, 0 AS fence, statement_timestamp() AS next_attempt_at, statement_timestamp() AS created_at, statement_timestamp() AS updated_at, CASE WHEN (given.hold_seconds IS NULL) THEN NULL ELSE (statement_timestamp() + make_interval(secs => given.hold_seconds)) END AS hold_until 
FROM (SELECT given.message_id AS message_id, given.run_id AS run_id, given.channel AS channel, given.recipient AS recipient, given.subject AS subject, given.body AS body, given.headers AS headers, given.payload AS payload, given.status AS status, given.hold_seconds AS hold_seconds 
FROM jsonb_to_recordset(%(messages)s::JSONB) AS given(message_id VARCHAR(64), run_id VARCHAR(64), channel VARCHAR(32), recipient VARCHAR(1100), subject TEXT, body TEXT, headers JSONB, payload JSONB, status VARCHAR(16), hold_seconds FLOAT)) AS given 
WHERE EXISTS (SELECT accepted.run_id 
FROM accepted) ON CONFLICT DO NOTHING)
 SELECT accepted.run_id, accepted.job, accepted.subject, accepted.period_start, accepted.version, accepted.params_fingerprint, accepted.params, accepted.status, accepted.fence, accepted.owner, accepted.lease_expires_at, accepted.attempts, accepted.raw_input, accepted.output, accepted.error, accepted.completed_attempt_id, accepted.completed_flow_run_id, accepted.completed_task_run_id, accepted.model_calls, accepted.created_at, accepted.updated_at, accepted.completed_at, accepted.revision, accepted.revises_run_id, accepted.revision_reason, accepted.resend, accepted.requested_by, accepted.pruned_at, accepted.output_digest 
FROM accepted;

-- name: finish_attempt
-- End the Attempt with its outcome (completed, released, failed), error and model calls.
-- parameters: outcome, error, model_calls, attempt_id
UPDATE attempts SET finished_at=statement_timestamp(), outcome=%(outcome)s::VARCHAR, error=%(error)s::VARCHAR, model_calls=%(model_calls)s::INTEGER WHERE attempts.attempt_id = %(attempt_id)s::VARCHAR;

-- name: release_or_fail_run
-- Record the error, add the Attempt's model calls and clear the lease, the Run going back to
-- pending (retryable) or to failed; only the current fence holder can.
-- parameters: status, error, model_calls, run_id, fence, owner
UPDATE runs SET status=%(status)s::VARCHAR, owner=NULL, lease_expires_at=NULL, error=%(error)s::VARCHAR, model_calls=(runs.model_calls + %(model_calls)s::INTEGER), updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: requeue_run
-- Operator action: a failed Run goes back to pending; no other status can.
-- parameters: run_id
UPDATE runs SET status='pending', updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.status = 'failed' RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: take_over_run
-- Operator action: a running Run (the one given, or every one the given owner holds) goes back to
-- pending, its lease cleared and its fence raised by one, so that the holder's next write is
-- refused, whether its lease had expired or not; its error says whose lease was taken over and
-- why.
-- parameters: reason, run_id, owner
UPDATE runs SET status='pending', fence=(runs.fence + 1), owner=NULL, lease_expires_at=NULL, error=('lease of ' || runs.owner || ' taken over: ' || %(reason)s::VARCHAR), updated_at=statement_timestamp() WHERE (CAST(%(run_id)s::VARCHAR AS VARCHAR(64)) IS NULL OR runs.run_id = CAST(%(run_id)s::VARCHAR AS VARCHAR(64))) AND (CAST(%(owner)s::VARCHAR AS VARCHAR(300)) IS NULL OR runs.owner = CAST(%(owner)s::VARCHAR AS VARCHAR(300))) AND runs.status = 'running' RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: end_taken_over_attempt
-- The Attempt of a Run taken over (its claim's fence) ends released, with the reason.
-- parameters: error, run_id, fence
UPDATE attempts SET finished_at=statement_timestamp(), outcome='released', error=%(error)s::VARCHAR WHERE attempts.run_id = %(run_id)s::VARCHAR AND attempts.fence = %(fence)s::INTEGER AND attempts.finished_at IS NULL;

-- name: list_revisions
-- Every revision of the logical run of the given Run (any of its revisions), oldest first, without
-- documents.
-- parameters: run_id
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs AS given JOIN runs ON runs.job = given.job AND runs.subject = given.subject AND runs.period_start = given.period_start AND runs.version = given.version 
WHERE given.run_id = %(run_id)s::VARCHAR ORDER BY runs.revision;

-- name: request_revision
-- Insert the next revision of a logical run as pending, only if the revision before it is finished
-- (at most one unfinished revision per Run); the identity key lets one of two concurrent requests
-- win.
-- parameters: run_id, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, recollect, source_run_id
INSERT INTO runs (run_id, job, subject, period_start, version, revision, revises_run_id, revision_reason, resend, requested_by, params_fingerprint, params, raw_input, status, fence, attempts, created_at, updated_at) SELECT %(run_id)s::VARCHAR AS run_id, source.job, source.subject, source.period_start, source.version, %(revision)s::INTEGER AS revision, %(revises_run_id)s::VARCHAR AS revises_run_id, %(revision_reason)s::VARCHAR AS revision_reason, %(resend)s AS resend, %(requested_by)s::VARCHAR AS requested_by, %(params_fingerprint)s::VARCHAR AS params_fingerprint, %(params)s::JSONB AS params, CASE WHEN %(recollect)s THEN NULL ELSE source.raw_input END AS raw_input, 'pending' AS status, 0 AS fence, 0 AS attempts, statement_timestamp() AS created_at, statement_timestamp() AS updated_at 
FROM runs AS source 
WHERE source.run_id = %(source_run_id)s::VARCHAR AND (EXISTS (SELECT prev.run_id 
FROM runs AS prev 
WHERE prev.run_id = %(revises_run_id)s::VARCHAR AND prev.revision = %(revision)s::INTEGER - 1 AND (prev.status = 'completed' OR prev.status = 'failed' AND prev.revision > 0))) ON CONFLICT DO NOTHING RETURNING runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.raw_input, runs.output, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest;

-- name: count_suppressed
-- Add one tick's Runs asked for again (completed: duplicates; leased by another worker: in
-- progress elsewhere) to its job's counts for the UTC day.
-- parameters: job, day, duplicates, in_progress_elsewhere
INSERT INTO suppressed_counts (job, day, duplicates, in_progress_elsewhere, updated_at) VALUES (%(job)s::VARCHAR, %(day)s::DATE, %(duplicates)s::INTEGER, %(in_progress_elsewhere)s::INTEGER, statement_timestamp()) ON CONFLICT (job, day) DO UPDATE SET duplicates = (suppressed_counts.duplicates + excluded.duplicates), in_progress_elsewhere = (suppressed_counts.in_progress_elsewhere + excluded.in_progress_elsewhere), updated_at = excluded.updated_at;

-- name: read_completed_since
-- The Runs completed from a moment on (optionally of one job): job, completion time, attempts and
-- revision number, no documents.
-- parameters: since, job
SELECT runs.job, runs.completed_at, runs.attempts, runs.revision 
FROM runs 
WHERE runs.status = 'completed' AND runs.completed_at >= %(since)s::TIMESTAMP WITH TIME ZONE AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: read_attempts_since
-- The Attempts started or ended from a moment on (optionally of one job's Runs): times, outcome
-- and model calls.
-- parameters: since, job
SELECT runs.job, attempts.started_at, attempts.finished_at, attempts.outcome, attempts.model_calls 
FROM attempts JOIN runs ON runs.run_id = attempts.run_id 
WHERE (attempts.started_at >= %(since)s::TIMESTAMP WITH TIME ZONE OR attempts.finished_at >= %(since)s::TIMESTAMP WITH TIME ZONE) AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: read_messages_since
-- The outbox messages queued from a moment on (optionally of one job's Runs): queue time and
-- status.
-- parameters: since, job
SELECT runs.job, outbox.created_at, outbox.status 
FROM outbox JOIN runs ON runs.run_id = outbox.run_id 
WHERE outbox.created_at >= %(since)s::TIMESTAMP WITH TIME ZONE AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: read_suppressed_since
-- The suppressed counts from a UTC day on (optionally of one job).
-- parameters: day, job
SELECT suppressed_counts.job, suppressed_counts.day, suppressed_counts.duplicates, suppressed_counts.in_progress_elsewhere 
FROM suppressed_counts 
WHERE suppressed_counts.day >= %(day)s::DATE AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR suppressed_counts.job = CAST(%(job)s::VARCHAR AS VARCHAR(200)));

-- name: prune_window
-- The id of the last of the next Runs in id order after the cursor (at most limit of them): the
-- end of a prune batch's window.
-- parameters: after, limit
SELECT max(run_id) AS until 
FROM (SELECT runs.run_id AS run_id 
FROM runs 
WHERE runs.run_id > %(after)s::VARCHAR ORDER BY runs.run_id 
 LIMIT %(limit)s::INTEGER) AS "window";

-- name: pick_prunable_runs
-- Lock the Runs of the batch's window (ids after the cursor, up to its end) that are completed
-- before the cutoff, of the given jobs, not tombstones and without an outbox message still to
-- deliver, with their outputs (to digest) and their documents' stored size.
-- parameters: after, until, cutoff, jobs
SELECT runs.run_id, runs.output, coalesce(pg_column_size(runs.raw_input), 0) + coalesce(pg_column_size(runs.output), 0) + coalesce(pg_column_size(runs.error), 0) + coalesce(pg_column_size(runs.params), 0) AS document_bytes 
FROM runs 
WHERE runs.run_id > %(after)s::VARCHAR AND runs.run_id <= %(until)s::VARCHAR AND runs.status = 'completed' AND runs.pruned_at IS NULL AND runs.completed_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200))) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = 'pending' OR outbox.status = 'sending' OR outbox.status = 'retry' OR outbox.status = 'uncertain' OR outbox.status = 'held'))) ORDER BY runs.run_id FOR UPDATE OF runs;

-- name: lock_pruned_messages
-- Lock the outbox rows of the picked Runs and read their status again: a message requeued since
-- the pick keeps its Run out of the batch.
-- parameters: ids
SELECT outbox.run_id, outbox.status 
FROM outbox 
WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) FOR UPDATE;

-- name: delete_pruned_delivery_attempts
-- Delete the delivery attempts of the pruned Runs' sent and dead messages.
-- parameters: ids
DELETE FROM delivery_attempts WHERE delivery_attempts.message_id IN (SELECT outbox.message_id 
FROM outbox 
WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND (outbox.status = 'sent' OR outbox.status = 'dead')) RETURNING delivery_attempts.id;

-- name: delete_pruned_messages
-- Delete the pruned Runs' sent and dead outbox rows (never a message still to deliver, nor one a
-- person decided: it is the decision's record).
-- parameters: ids
DELETE FROM outbox WHERE outbox.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND (outbox.status = 'sent' OR outbox.status = 'dead') AND outbox.decision IS NULL RETURNING outbox.message_id;

-- name: delete_pruned_attempts
-- Delete the pruned Runs' Attempts.
-- parameters: ids
DELETE FROM attempts WHERE attempts.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) RETURNING attempts.attempt_id;

-- name: forget_pruned_answers
-- Null the answers of the pruned Runs' model calls; their cost, tokens and outcome stay.
-- parameters: ids
UPDATE model_calls SET answer=NULL WHERE model_calls.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND model_calls.answer IS NOT NULL RETURNING model_calls.call_id;

-- name: delete_pruned_occurrences
-- Delete the pruned Runs' alert occurrences (overdue, recovered) whose events are known emitted; a
-- skip decision is kept.
-- parameters: ids
DELETE FROM occurrences WHERE occurrences.run_id IN (SELECT given.run_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(run_id VARCHAR(64))) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL) RETURNING occurrences.run_id;

-- name: bury_runs
-- Turn the picked completed Runs into tombstones: record their output digests and the prune time
-- (database clock), null their raw input, output, error and params; identity, status, fence,
-- fingerprint, counts and completion stay.
-- parameters: digests
UPDATE runs SET params=NULL, raw_input=NULL, output=NULL, error=NULL, updated_at=statement_timestamp(), pruned_at=statement_timestamp(), output_digest=buried.output_digest FROM (SELECT given.run_id AS run_id, given.output_digest AS output_digest 
FROM jsonb_to_recordset(%(digests)s::JSONB) AS given(run_id VARCHAR(64), output_digest VARCHAR(64))) AS buried WHERE runs.run_id = buried.run_id AND runs.status = 'completed' AND runs.pruned_at IS NULL RETURNING runs.run_id;

-- name: count_prunable
-- What a prune pass with this cutoff and these jobs would make tombstones and delete (a dry run),
-- and the Runs from before the cutoff it leaves alone, by why.
-- parameters: cutoff, jobs
WITH picked AS 
(SELECT runs.run_id AS run_id, coalesce(pg_column_size(runs.raw_input), 0) + coalesce(pg_column_size(runs.output), 0) + coalesce(pg_column_size(runs.error), 0) + coalesce(pg_column_size(runs.params), 0) AS size 
FROM runs 
WHERE runs.status = 'completed' AND runs.pruned_at IS NULL AND runs.completed_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200))) AND NOT (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = 'pending' OR outbox.status = 'sending' OR outbox.status = 'retry' OR outbox.status = 'uncertain' OR outbox.status = 'held'))))
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
FROM picked) AND occurrences.skipped_at IS NULL AND (occurrences.overdue_at IS NULL OR occurrences.overdue_emitted_at IS NOT NULL) AND (occurrences.recovered_at IS NULL OR occurrences.recovered_emitted_at IS NOT NULL) AND (occurrences.gave_up_at IS NULL OR occurrences.gave_up_emitted_at IS NOT NULL)) AS occurrences, (SELECT coalesce(sum(picked.size), 0) AS coalesce_1 
FROM picked) AS document_bytes, (SELECT count(*) AS count_6 
FROM runs 
WHERE runs.status = 'completed' AND runs.pruned_at IS NULL AND runs.completed_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200))) AND (EXISTS (SELECT * 
FROM outbox 
WHERE outbox.run_id = runs.run_id AND (outbox.status = 'pending' OR outbox.status = 'sending' OR outbox.status = 'retry' OR outbox.status = 'uncertain' OR outbox.status = 'held')))) AS unfinished_outbox, (SELECT count(*) AS count_7 
FROM runs 
WHERE runs.status = 'failed' AND runs.created_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200)))) AS failed, (SELECT count(*) AS count_8 
FROM runs 
WHERE (runs.status = 'pending' OR runs.status = 'running' OR runs.status = 'waiting') AND runs.created_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200)))) AS unfinished, (SELECT count(*) AS count_9 
FROM runs 
WHERE runs.pruned_at IS NOT NULL AND runs.job IN (SELECT given.job 
FROM jsonb_to_recordset(%(jobs)s::JSONB) AS given(job VARCHAR(200)))) AS tombstones;

-- name: wait_for_batch
-- A running Run whose calls are queued in a batch waits for it (never claimed), its lease cleared
-- and the attempt it took given back; pending at once when none of its calls is still queued (its
-- batch settled already); only the current fence holder can.
-- parameters: error, run_id, fence, owner
UPDATE runs SET status=CASE WHEN (EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.outcome = 'queued')) THEN 'waiting' ELSE 'pending' END, owner=NULL, lease_expires_at=NULL, attempts=CASE WHEN (runs.attempts > 0) THEN runs.attempts - 1 ELSE 0 END, error=%(error)s::VARCHAR, updated_at=statement_timestamp() WHERE runs.run_id = %(run_id)s::VARCHAR AND runs.fence = %(fence)s::INTEGER AND runs.owner = %(owner)s::VARCHAR AND runs.status = 'running' RETURNING runs.attempts, runs.status;

-- name: end_waiting_attempt
-- The Attempt of a Run that waits for its batch ends released, with its note.
-- parameters: error, attempt_id
UPDATE attempts SET finished_at=statement_timestamp(), outcome='released', error=%(error)s::VARCHAR, model_calls=0 WHERE attempts.attempt_id = %(attempt_id)s::VARCHAR;

-- name: pick_queued_calls
-- The oldest queued calls of a job and endpoint that no batch holds (queued before the given time,
-- if one is given), at most the limit, skipping rows another submitter has locked (PostgreSQL).
-- parameters: endpoint, job, queued_before, limit
SELECT model_calls.call_id, model_calls.custom_id, model_calls.request, model_calls.queued_tokens 
FROM model_calls 
WHERE outcome = 'queued' AND batch_key IS NULL AND model_calls.endpoint = %(endpoint)s::VARCHAR AND model_calls.job = %(job)s::VARCHAR AND (%(queued_before)s::TIMESTAMP WITH TIME ZONE IS NULL OR model_calls.started_at < %(queued_before)s::TIMESTAMP WITH TIME ZONE) ORDER BY model_calls.started_at, model_calls.call_id 
 LIMIT %(limit)s::INTEGER FOR UPDATE SKIP LOCKED;

-- name: count_enqueued_tokens
-- The prompt tokens an endpoint's calls hold in its batches open or submitted (what its provider's
-- enqueued-token limit counts).
-- parameters: endpoint
SELECT coalesce(sum(model_calls.queued_tokens), 0) AS tokens 
FROM model_calls JOIN batches ON batches.batch_key = model_calls.batch_key 
WHERE batches.endpoint = %(endpoint)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND model_calls.outcome = 'queued';

-- name: open_batch
-- Insert a batch open, its lease held by the submitter that opened it (fence 1, database clock),
-- with how many calls it holds, the digest of its lines and its deadline.
-- parameters: batch_key, job, endpoint, model, kind, flow_run_id, period_start, input_digest, requests, owner, lease, deadline_at
INSERT INTO batches (batch_key, job, endpoint, model, kind, status, flow_run_id, period_start, input_digest, requests, fence, owner, lease_expires_at, deadline_at, created_at) VALUES (%(batch_key)s::VARCHAR, %(job)s::VARCHAR, %(endpoint)s::VARCHAR, %(model)s::VARCHAR, %(kind)s::VARCHAR, 'open', %(flow_run_id)s::VARCHAR, %(period_start)s::TIMESTAMP WITH TIME ZONE, %(input_digest)s::VARCHAR, %(requests)s::INTEGER, 1, %(owner)s::VARCHAR, (statement_timestamp() + make_interval(secs => %(lease)s)), %(deadline_at)s::TIMESTAMP WITH TIME ZONE, statement_timestamp()) RETURNING batches.batch_key, batches.fence, batches.owner, batches.status, batches.job, batches.endpoint, batches.model, batches.kind, batches.provider_file_id, batches.provider_batch_id, batches.flow_run_id, batches.period_start, batches.deadline_at, batches.requests, batches.created_at;

-- name: stamp_batch_calls
-- The picked calls, still queued and in no batch, are held by the batch (given as one JSON array).
-- parameters: batch_key, ids
UPDATE model_calls SET batch_key=%(batch_key)s::VARCHAR WHERE model_calls.call_id IN (SELECT given.call_id 
FROM jsonb_to_recordset(%(ids)s::JSONB) AS given(call_id VARCHAR(36))) AND model_calls.outcome = 'queued' AND model_calls.batch_key IS NULL RETURNING model_calls.call_id;

-- name: claim_batch
-- Take the lease of a batch in flight (open or submitted) whose lease is free or expired (database
-- clock): bump its fence.
-- parameters: owner, lease, batch_key
UPDATE batches SET fence=(batches.fence + 1), owner=%(owner)s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)) WHERE batches.batch_key = %(batch_key)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND (batches.lease_expires_at IS NULL OR batches.lease_expires_at <= statement_timestamp()) RETURNING batches.batch_key, batches.fence, batches.owner, batches.status, batches.job, batches.endpoint, batches.model, batches.kind, batches.provider_file_id, batches.provider_batch_id, batches.flow_run_id, batches.period_start, batches.deadline_at, batches.requests, batches.created_at;

-- name: claim_due_batches
-- Lease the oldest batches in flight whose lease is free or expired (database clock), at most the
-- limit, skipping rows another poller has locked (PostgreSQL); each claim bumps the fence.
-- parameters: owner, lease, limit
UPDATE batches SET fence=(batches.fence + 1), owner=%(owner)s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)) WHERE batches.batch_key IN (SELECT batches.batch_key 
FROM batches 
WHERE (batches.status = 'open' OR batches.status = 'submitted') AND (batches.lease_expires_at IS NULL OR batches.lease_expires_at <= statement_timestamp()) ORDER BY batches.created_at, batches.batch_key 
 LIMIT %(limit)s::INTEGER FOR UPDATE SKIP LOCKED) AND (batches.status = 'open' OR batches.status = 'submitted') AND (batches.lease_expires_at IS NULL OR batches.lease_expires_at <= statement_timestamp()) RETURNING batches.batch_key, batches.fence, batches.owner, batches.status, batches.job, batches.endpoint, batches.model, batches.kind, batches.provider_file_id, batches.provider_batch_id, batches.flow_run_id, batches.period_start, batches.deadline_at, batches.requests, batches.created_at;

-- name: list_batch_lines
-- The lines of a batch's file (its calls' ids and request bodies), in custom_id order.
-- parameters: batch_key
SELECT model_calls.custom_id, model_calls.request 
FROM model_calls 
WHERE model_calls.batch_key = %(batch_key)s::VARCHAR ORDER BY model_calls.custom_id;

-- name: record_batch_file
-- Store the id of the batch's uploaded file and extend the lease (its holder creates the batch
-- next: no other may take it meanwhile); only the holder of the batch's lease can.
-- parameters: provider_file_id, lease, batch_key, fence, owner
UPDATE batches SET provider_file_id=%(provider_file_id)s::VARCHAR, lease_expires_at=(statement_timestamp() + make_interval(secs => %(lease)s)) WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() RETURNING batches.batch_key;

-- name: find_batch_create_in_doubt
-- Another open batch of the kind whose requests go with its create has its file id stored and no
-- provider id yet: its create is in doubt.
-- parameters: kind, batch_key
SELECT batches.batch_key 
FROM batches 
WHERE batches.kind = %(kind)s::VARCHAR AND batches.batch_key != %(batch_key)s::VARCHAR AND provider_file_id = 'inline' AND provider_batch_id IS NULL AND status = 'open' 
 LIMIT 1;

-- name: release_batch_lease
-- Give the batch's lease back at once (the next poll takes it); only the holder of the batch's
-- lease can.
-- parameters: batch_key, fence, owner
UPDATE batches SET lease_expires_at=statement_timestamp() WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() RETURNING batches.batch_key;

-- name: forget_batch_file
-- Clear the file id of a batch its provider refused to create (its create is no longer in doubt);
-- only the holder of the batch's lease can.
-- parameters: batch_key, fence, owner
UPDATE batches SET provider_file_id=NULL WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() AND batches.provider_batch_id IS NULL RETURNING batches.batch_key;

-- name: stop_waiting_for_batch
-- A batch in flight whose deadline is later (or none) has it moved to now: the next poll cancels
-- it at its provider and calls synchronously what it ends without; a deadline only ever moves
-- earlier.
-- parameters: batch_key
UPDATE batches SET deadline_at=statement_timestamp() WHERE batches.batch_key = %(batch_key)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND (batches.deadline_at IS NULL OR batches.deadline_at > statement_timestamp()) RETURNING batches.batch_key;

-- name: record_batch_submitted
-- The provider has the batch: its id and status stored, the batch submitted and its lease
-- released; only the holder of the batch's lease can.
-- parameters: provider_batch_id, provider_status, batch_key, fence, owner
UPDATE batches SET status='submitted', provider_batch_id=%(provider_batch_id)s::VARCHAR, provider_status=%(provider_status)s::VARCHAR, owner=NULL, lease_expires_at=NULL, submitted_at=statement_timestamp() WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() RETURNING batches.batch_key;

-- name: record_batch_polled
-- A batch still running at the provider: its status and counts as reported noted and its lease
-- released; only the holder of the batch's lease can.
-- parameters: provider_status, provider_total, provider_completed, provider_failed, batch_key, fence, owner
UPDATE batches SET provider_status=%(provider_status)s::VARCHAR, provider_total=%(provider_total)s::INTEGER, provider_completed=%(provider_completed)s::INTEGER, provider_failed=%(provider_failed)s::INTEGER, owner=NULL, lease_expires_at=NULL, polled_at=statement_timestamp() WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() RETURNING batches.batch_key;

-- name: settle_batch_call
-- A call of the batch still queued ends as its result line says (answered with its checkpoint, or
-- refused or failed with its error), with its usage; only while the batch's lease is held.
-- parameters: outcome, error, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, latency_ms, cost_nanos, currency, overrun, sync_cost_nanos, answer, batch_key, custom_id, fence, owner
UPDATE model_calls SET finished_at=statement_timestamp(), outcome=%(outcome)s::VARCHAR, error=%(error)s::VARCHAR, prompt_tokens=%(prompt_tokens)s::INTEGER, completion_tokens=%(completion_tokens)s::INTEGER, cached_tokens=%(cached_tokens)s::INTEGER, cache_write_tokens=%(cache_write_tokens)s::INTEGER, latency_ms=%(latency_ms)s::INTEGER, cost_nanos=%(cost_nanos)s::BIGINT, currency=%(currency)s::VARCHAR, overrun=%(overrun)s::BIGINT, sync_cost_nanos=%(sync_cost_nanos)s::BIGINT, answer=%(answer)s::JSONB WHERE model_calls.batch_key = %(batch_key)s::VARCHAR AND model_calls.custom_id = %(custom_id)s::VARCHAR AND model_calls.outcome = 'queued' AND (EXISTS (SELECT batches.batch_key 
FROM batches 
WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp())) RETURNING model_calls.call_id, model_calls.custom_id, model_calls.job, model_calls.estimate, model_calls.budget_period, model_calls.budget_day;

-- name: finish_batch
-- The batch is settled: what became of its calls counted (answered, refused, failed, still queued,
-- withdrawn) and their cost added up, the provider's last status noted, its lease released; only
-- the holder of the batch's lease can.
-- parameters: provider_status, error, batch_key, fence, owner
UPDATE batches SET status='settled', provider_status=%(provider_status)s::VARCHAR, owner=NULL, lease_expires_at=NULL, settled_at=statement_timestamp(), answered=(SELECT count(*) AS count_1 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key AND model_calls.outcome = 'answered'), refused=(SELECT count(*) AS count_2 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key AND model_calls.outcome = 'refused'), failed=(SELECT count(*) AS count_3 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key AND model_calls.outcome = 'failed'), requeued=(SELECT count(*) AS count_4 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key AND model_calls.outcome = 'queued'), withdrawn=(SELECT count(*) AS count_5 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key AND model_calls.outcome = 'withdrawn'), cost_nanos=(SELECT sum(model_calls.cost_nanos) AS sum_1 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key), currency=(SELECT max(model_calls.currency) AS max_1 
FROM model_calls 
WHERE model_calls.batch_key = batches.batch_key), error=%(error)s::VARCHAR WHERE batches.batch_key = %(batch_key)s::VARCHAR AND batches.fence = %(fence)s::INTEGER AND batches.owner = %(owner)s::VARCHAR AND (batches.status = 'open' OR batches.status = 'submitted') AND batches.lease_expires_at > statement_timestamp() RETURNING batches.requeued;

-- name: requeue_batch_calls
-- The calls of a finished batch that no result settled (expired, cancelled, a transient line
-- error) go back to the queue for the next batch.
-- parameters: batch_key
UPDATE model_calls SET batch_key=NULL WHERE model_calls.batch_key = %(batch_key)s::VARCHAR AND model_calls.outcome = 'queued' RETURNING model_calls.call_id;

-- name: fail_waiting_runs
-- A waiting Run none of whose calls is still queued fails when one of its calls in the finished
-- batch was refused or failed, with that call's error.
-- parameters: batch_key
UPDATE runs SET status='failed', error=(SELECT model_calls.error 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.batch_key = %(batch_key)s::VARCHAR AND (model_calls.outcome = 'refused' OR model_calls.outcome = 'failed') ORDER BY model_calls.finished_at, model_calls.call_id 
 LIMIT 1), updated_at=statement_timestamp() WHERE runs.status = 'waiting' AND NOT (EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.outcome = 'queued')) AND (EXISTS (SELECT model_calls.error 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.batch_key = %(batch_key)s::VARCHAR AND (model_calls.outcome = 'refused' OR model_calls.outcome = 'failed') ORDER BY model_calls.finished_at, model_calls.call_id 
 LIMIT 1)) RETURNING runs.run_id, runs.job, runs.subject, runs.period_start;

-- name: release_waiting_runs
-- A waiting Run with calls in the finished batch and none still queued is pending again: a tick
-- runs it and replays its settled answers.
-- parameters: batch_key
UPDATE runs SET status='pending', error=NULL, updated_at=statement_timestamp() WHERE runs.status = 'waiting' AND NOT (EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.outcome = 'queued')) AND (EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.batch_key = %(batch_key)s::VARCHAR)) RETURNING runs.run_id, runs.job, runs.subject, runs.period_start;

-- name: list_orphaned_queues
-- The jobs and endpoints with queued calls that no batch holds, queued before the given time
-- (their tick died before it opened their batch): each with its model and when its oldest such
-- call was queued.
-- parameters: queued_before
SELECT model_calls.job, model_calls.endpoint, max(model_calls.model) AS model, min(model_calls.started_at) AS oldest 
FROM model_calls 
WHERE outcome = 'queued' AND batch_key IS NULL AND model_calls.started_at < %(queued_before)s::TIMESTAMP WITH TIME ZONE GROUP BY model_calls.job, model_calls.endpoint ORDER BY model_calls.job, model_calls.endpoint;

-- name: list_batch_ticks
-- The ticks whose calls a batch holds or settled: each flow run that queued them, with its job and
-- period.
-- parameters: batch_key
SELECT DISTINCT model_calls.flow_run_id, runs.job, runs.period_start 
FROM model_calls JOIN runs ON runs.run_id = model_calls.run_id 
WHERE model_calls.batch_key = %(batch_key)s::VARCHAR AND model_calls.flow_run_id IS NOT NULL ORDER BY model_calls.flow_run_id;

-- name: list_batches
-- The latest batches, newest first, optionally of one status.
-- parameters: status, limit
SELECT batches.batch_key, batches.job, batches.endpoint, batches.model, batches.kind, batches.status, batches.flow_run_id, batches.period_start, batches.input_digest, batches.requests, batches.provider_file_id, batches.provider_batch_id, batches.provider_status, batches.provider_total, batches.provider_completed, batches.provider_failed, batches.fence, batches.owner, batches.lease_expires_at, batches.deadline_at, batches.created_at, batches.submitted_at, batches.polled_at, batches.settled_at, batches.answered, batches.refused, batches.failed, batches.requeued, batches.withdrawn, batches.cost_nanos, batches.currency, batches.error 
FROM batches 
WHERE CAST(%(status)s::VARCHAR AS VARCHAR(16)) IS NULL OR batches.status = CAST(%(status)s::VARCHAR AS VARCHAR(16)) ORDER BY batches.created_at DESC, batches.batch_key 
 LIMIT %(limit)s::INTEGER;

-- name: get_batch
-- A batch by its key or by the provider's batch id.
-- parameters: key
SELECT batches.batch_key, batches.job, batches.endpoint, batches.model, batches.kind, batches.status, batches.flow_run_id, batches.period_start, batches.input_digest, batches.requests, batches.provider_file_id, batches.provider_batch_id, batches.provider_status, batches.provider_total, batches.provider_completed, batches.provider_failed, batches.fence, batches.owner, batches.lease_expires_at, batches.deadline_at, batches.created_at, batches.submitted_at, batches.polled_at, batches.settled_at, batches.answered, batches.refused, batches.failed, batches.requeued, batches.withdrawn, batches.cost_nanos, batches.currency, batches.error 
FROM batches 
WHERE batches.batch_key = %(key)s::VARCHAR OR batches.provider_batch_id = %(key)s::VARCHAR ORDER BY batches.created_at 
 LIMIT 1;

-- name: list_batch_ids_submitted_since
-- The provider batch ids of the batches submitted since a time.
-- parameters: since
SELECT batches.provider_batch_id 
FROM batches 
WHERE batches.provider_batch_id IS NOT NULL AND batches.submitted_at >= %(since)s::TIMESTAMP WITH TIME ZONE;

-- name: list_batch_calls
-- The model calls a batch holds or settled, in custom_id order, without answers (nor requests).
-- parameters: batch_key
SELECT model_calls.call_id, model_calls.run_id, model_calls.attempt_id, model_calls.fence, model_calls.job, model_calls.endpoint, model_calls.model, model_calls.position, model_calls.prompt_digest, model_calls.started_at, model_calls.finished_at, model_calls.outcome, model_calls.error, model_calls.prompt_tokens, model_calls.completion_tokens, model_calls.cached_tokens, model_calls.cache_write_tokens, model_calls.latency_ms, model_calls.cost_nanos, model_calls.currency, model_calls.overrun, model_calls.sync_cost_nanos, model_calls.rejected_at, model_calls.reuses, model_calls.estimate, model_calls.budget_period, model_calls.budget_day, model_calls.batch_key, model_calls.custom_id, model_calls.flow_run_id, model_calls.queued_tokens 
FROM model_calls 
WHERE model_calls.batch_key = %(batch_key)s::VARCHAR ORDER BY model_calls.custom_id;

-- name: list_released_runs
-- The pending Runs a settled batch released and no attempt ran yet: an answered batch call of
-- theirs waits to be replayed, or a withdrawn one to be called synchronously; oldest period first,
-- at most the limit, without documents; ``withdrawn`` tells the latter.
-- parameters: limit
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest, EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.outcome = 'withdrawn') AS withdrawn 
FROM runs 
WHERE runs.status = 'pending' AND ((EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.outcome = 'withdrawn')) OR (EXISTS (SELECT model_calls.call_id 
FROM model_calls 
WHERE model_calls.run_id = runs.run_id AND model_calls.batch_key IS NOT NULL AND model_calls.outcome = 'answered' AND model_calls.rejected_at IS NULL))) ORDER BY runs.period_start, runs.job, runs.subject, runs.revision 
 LIMIT %(limit)s::INTEGER;

-- name: list_unsettled_tick_flow_runs
-- The flow runs of the ticks a queued call of which still waits (in a batch, or for one).
SELECT DISTINCT model_calls.flow_run_id 
FROM model_calls 
WHERE model_calls.outcome = 'queued' AND model_calls.flow_run_id IS NOT NULL;

-- name: list_waiting_runs
-- The Runs waiting for a batch, optionally of one job, oldest period first, without documents.
-- parameters: job
SELECT runs.run_id, runs.job, runs.subject, runs.period_start, runs.version, runs.params_fingerprint, runs.params, runs.status, runs.fence, runs.owner, runs.lease_expires_at, runs.attempts, runs.error, runs.completed_attempt_id, runs.completed_flow_run_id, runs.completed_task_run_id, runs.model_calls, runs.created_at, runs.updated_at, runs.completed_at, runs.revision, runs.revises_run_id, runs.revision_reason, runs.resend, runs.requested_by, runs.pruned_at, runs.output_digest 
FROM runs 
WHERE runs.status = 'waiting' AND (CAST(%(job)s::VARCHAR AS VARCHAR(200)) IS NULL OR runs.job = CAST(%(job)s::VARCHAR AS VARCHAR(200))) ORDER BY runs.period_start, runs.job, runs.subject, runs.revision;

-- SQLite queries of leaseq: finish (placeholders as described in common.sql).
-- Every finish is fenced by id + lease_epoch + status processing + the claim's worker and
-- token (:worker_id, :claim_token NULL: unchecked, a lease made by hand); see
-- leaseq.job.Lease.

-- name: fenced_row
SELECT stale, attempts, max_attempts, snoozes, givebacks FROM leaseq_jobs
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token);

-- name: complete
UPDATE leaseq_jobs
SET status = :status, result = :result, result_key = :result_key, failure = NULL,
    lease_until = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- :items is a JSON array of [id, lease_epoch, status, result_json, result_key, worker_id,
-- claim_token]. Stale jobs are left out here (they become give-backs one by one).
-- name: complete_many
WITH i AS MATERIALIZED (  -- materialized so the plan drives from the items into the primary key
    SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS lease_epoch,
           json_extract(value, '$[2]') AS status, json_extract(value, '$[3]') AS result,
           json_extract(value, '$[4]') AS result_key, json_extract(value, '$[5]') AS worker_id,
           json_extract(value, '$[6]') AS claim_token
    FROM json_each(:items))
UPDATE leaseq_jobs
SET status = i.status, result = i.result, result_key = i.result_key, failure = NULL,
    lease_until = NULL, updated_at = {now}
FROM i
WHERE leaseq_jobs.queue = :queue AND leaseq_jobs.id = i.id
  AND leaseq_jobs.lease_epoch = i.lease_epoch AND leaseq_jobs.status = 'processing'
  AND (i.worker_id IS NULL OR leaseq_jobs.worker_id = i.worker_id)
  AND (i.claim_token IS NULL OR leaseq_jobs.claim_token = i.claim_token)
  AND leaseq_jobs.stale = 0
RETURNING *;

-- name: retry_later
UPDATE leaseq_jobs
SET status = 'pending', error = :error, lease_until = {now} + :delay_s, published_at = NULL,
    updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- name: fail
UPDATE leaseq_jobs
SET status = 'failed', failure = :failure, error = :error, lease_until = NULL,
    updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- name: snooze
UPDATE leaseq_jobs
SET status = 'pending', attempts = max(attempts - 1, 0), snoozes = snoozes + 1,
    lease_until = {now} + :delay_s, stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- name: snoozed_out
UPDATE leaseq_jobs
SET status = 'failed', failure = 'exhausted', error = :error, snoozes = snoozes + 1,
    lease_until = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- Ready at once. :refund is 1 when the attempt is given back, :counted 1 when the give-back
-- counts toward max_givebacks.
-- name: give_back
UPDATE leaseq_jobs
SET status = 'pending', attempts = max(attempts - :refund, 0), givebacks = givebacks + :counted,
    lease_until = {now}, stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

-- A stale job's finish: the new revision starts fresh, ready at once.
-- name: restart_revision
UPDATE leaseq_jobs
SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
    stale = 0, concurrency_key = next_concurrency_key, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
  AND (:worker_id IS NULL OR worker_id = :worker_id)
  AND (:claim_token IS NULL OR claim_token = :claim_token)
RETURNING *;

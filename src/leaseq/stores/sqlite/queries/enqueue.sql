-- SQLite queries of leaseq: enqueue (placeholders as described in common.sql).

-- name: find_existing
SELECT id, status, payload, revision FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- name: insert_job
INSERT INTO leaseq_jobs (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                         lease_epoch, revision, created_at, updated_at, first_seen_at,
                         priority, concurrency_key)
VALUES (:queue, :id, :task, 'pending', :payload, 0, :max_attempts, {now} + :delay_s,
        0, :revision, {now}, {now}, {now}, :priority, :concurrency_key);

-- name: revive_job
UPDATE leaseq_jobs
SET status = 'pending', payload = :payload, task = :task, revision = :revision,
    max_attempts = :max_attempts, attempts = 0, snoozes = 0, givebacks = 0, failure = NULL,
    result = NULL,
    result_key = NULL, stale = 0, worker_id = NULL, lease_until = {now} + :delay_s,
    published_at = NULL, updated_at = {now}, priority = :priority,
    concurrency_key = :concurrency_key
WHERE queue = :queue AND id = :id;

-- A new revision starts with a fresh budget: attempts kept from the old one could be at or
-- past the new max_attempts, and nothing would ever claim the job again.
-- name: update_pending
UPDATE leaseq_jobs
SET payload = :payload, task = :task, revision = :revision, max_attempts = :max_attempts,
    attempts = 0, snoozes = 0, givebacks = 0,
    lease_until = {now} + :delay_s, published_at = NULL, updated_at = {now},
    priority = :priority, concurrency_key = :concurrency_key
WHERE queue = :queue AND id = :id;

-- A processing job keeps its lease; its worker's finish becomes a give-back (see base.py).
-- The running attempt belongs to the old revision, so the budget is reset now: an expired
-- lease then returns the job ready for the new revision instead of failing it as expired.
-- It keeps its concurrency key while it runs (the key's running count must not move); the
-- new revision's key waits in next_concurrency_key until the job goes back to pending.
-- name: mark_stale
UPDATE leaseq_jobs
SET payload = :payload, task = :task, revision = :revision, max_attempts = :max_attempts,
    attempts = 0, snoozes = 0, givebacks = 0, stale = 1, updated_at = {now},
    priority = :priority, next_concurrency_key = :concurrency_key
WHERE queue = :queue AND id = :id;

-- SQLite queries of leaseq: limits (placeholders as described in common.sql).

-- --- limits in the claim (docs/limits.md) ---------------------------------------------------
-- Every query below runs under BEGIN IMMEDIATE, which serialises the claims of every queue.

-- Each key with live jobs and how many of them are processing: a loose index scan
-- of leaseq_jobs_keyed, one seek per key, and a count in leaseq_jobs_keyed_running that
-- stops at :key_limit (the key is full then, however many run). The
-- predicates repeat the indexes'; without statistics the planner would count a key's jobs by
-- walking the queue's primary key, so the count names its index.
-- name: key_slots
WITH RECURSIVE keys(k) AS (
    SELECT min(concurrency_key) FROM leaseq_jobs
    WHERE queue = :queue AND concurrency_key IS NOT NULL
      AND status IN ('pending', 'processing')
    UNION ALL
    SELECT (SELECT min(j.concurrency_key) FROM leaseq_jobs j
            WHERE j.queue = :queue AND j.concurrency_key > keys.k
              AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing'))
    FROM keys WHERE keys.k IS NOT NULL)
SELECT k AS concurrency_key,
       (SELECT count(*) FROM (
            SELECT 1 FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
            WHERE r.queue = :queue AND r.concurrency_key = keys.k
              AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
            LIMIT :key_limit)) AS running
FROM keys WHERE k IS NOT NULL;

-- The first ready jobs of one key, in claim order.
-- name: key_candidates
SELECT id, priority, lease_until FROM leaseq_jobs
WHERE queue = :queue AND concurrency_key = :concurrency_key
  AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
  AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY priority DESC, lease_until, id
LIMIT :limit;

-- Ready jobs without a key, among the first :scan claimable jobs (limits.UNKEYED_SCAN).
-- name: unkeyed_candidates
SELECT id, priority, lease_until FROM (
    SELECT id, priority, lease_until, concurrency_key FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    ORDER BY priority DESC, lease_until, id
    LIMIT :scan)
WHERE concurrency_key IS NULL
LIMIT :limit;

-- The chosen candidates, each still claimable. :ids is a JSON array.
-- name: claim_chosen
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now}
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
RETURNING *;

-- name: limits_row
SELECT recent, key_limit, rate_per_s, {now} AS now FROM leaseq_limits WHERE queue = :queue;

-- name: save_limits
INSERT INTO leaseq_limits (queue, recent, key_limit, rate_per_s)
VALUES (:queue, :recent, :key_limit, :rate_per_s)
ON CONFLICT (queue) DO UPDATE
SET recent = excluded.recent, key_limit = excluded.key_limit, rate_per_s = excluded.rate_per_s;

-- Per key with ready jobs: how many are ready and how many run (for held_back).
-- name: key_backlog
SELECT concurrency_key,
       sum(status = 'processing') AS running,
       sum(attempts < max_attempts AND lease_until <= {now}
           AND (status = 'pending' OR lease_until < {now})) AS ready
FROM leaseq_jobs
WHERE queue = :queue AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
GROUP BY concurrency_key;

-- One job's key and how many of its key are processing (claim_one under a key limit).
-- name: job_key_running
SELECT j.concurrency_key,
       (SELECT count(*) FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
        WHERE r.queue = :queue AND r.concurrency_key = j.concurrency_key
          AND r.concurrency_key IS NOT NULL AND r.status = 'processing') AS running
FROM leaseq_jobs j WHERE j.queue = :queue AND j.id = :id;

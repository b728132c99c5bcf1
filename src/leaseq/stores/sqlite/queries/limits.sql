-- SQLite queries of leaseq: limits (placeholders as described in common.sql).

-- --- limits in the claim (docs/limits.md) ---------------------------------------------------
-- Every query below runs under BEGIN IMMEDIATE, which serialises the claims of every queue.

-- The key-limited claim by the whole key walk, in one statement (when the queue's front does
-- not decide the claim: see keyed_window). A loose scan of leaseq_jobs_keyed gives each key
-- with live jobs (one seek per key) and its count in leaseq_jobs_keyed_running, read no
-- further than :key_limit (the key is full then, however many run): its free slots. Per key
-- with free slots, its first :key_limit ready jobs (a seek and a short walk of
-- leaseq_jobs_keyed; SQLite's LIMIT cannot follow the row, so the key's rank keeps its first
-- `free`). Jobs without a key come from the front of the claimable index (among the first
-- :scan, limits.UNKEYED_SCAN). The best :limit of those, in claim order, are taken, each
-- still claimable. The predicates repeat the indexes'; without statistics the planner would
-- count a key's jobs by walking the queue's primary key, so the scans name their index.
-- A lapsed job whose new revision names another key (stale, next_concurrency_key:
-- enqueue.sql) is not taken by the walk of its old key: the front (keyed_window, which counts
-- it under the new key) or the sweep's reclaim (return_expired, which makes it pending under
-- the new key) brings it back. Without a key now, it is one of the jobs without a key.
-- name: claim_keyed
WITH RECURSIVE keys(k) AS (
    SELECT min(concurrency_key) FROM leaseq_jobs
    WHERE queue = :queue AND concurrency_key IS NOT NULL
      AND status IN ('pending', 'processing')
    UNION ALL
    SELECT (SELECT min(j.concurrency_key) FROM leaseq_jobs j
            WHERE j.queue = :queue AND j.concurrency_key > keys.k
              AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing'))
    FROM keys WHERE keys.k IS NOT NULL),
slots AS MATERIALIZED (
    SELECT k, :key_limit - (SELECT count(*) FROM (
            SELECT 1 FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
            WHERE r.queue = :queue AND r.concurrency_key = keys.k
              AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
            LIMIT :key_limit)) AS free
    FROM keys WHERE k IS NOT NULL),
keyed AS (
    SELECT j.rowid AS rid, j.priority, j.lease_until, j.id, s.free,
           row_number() OVER (PARTITION BY s.k ORDER BY j.priority DESC, j.lease_until, j.id)
               AS rank
    FROM slots s JOIN leaseq_jobs j
    ON j.rowid IN (
        SELECT c.rowid FROM leaseq_jobs c INDEXED BY leaseq_jobs_keyed
        WHERE c.queue = :queue AND c.concurrency_key = s.k
          AND c.concurrency_key IS NOT NULL AND c.status IN ('pending', 'processing')
          AND c.attempts < c.max_attempts
          AND c.lease_until <= {now} AND (c.status = 'pending' OR c.lease_until < {now})
          AND NOT (c.stale AND c.next_concurrency_key IS NOT c.concurrency_key)
        ORDER BY c.priority DESC, c.lease_until, c.id
        LIMIT :key_limit)
    WHERE s.free > 0),
cand AS (
    SELECT rid, priority, lease_until, id FROM keyed WHERE rank <= free
    UNION ALL
    SELECT rid, priority, lease_until, id FROM (
        SELECT rowid AS rid, priority, lease_until, id,
               CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END AS concurrency_key
        FROM leaseq_jobs
        WHERE queue = :queue
          AND status IN ('pending', 'processing') AND attempts < max_attempts
          AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
        ORDER BY priority DESC, lease_until, id
        LIMIT :scan)
    WHERE concurrency_key IS NULL)
UPDATE leaseq_jobs NOT INDEXED  -- by rowid (else the planner walks leaseq_jobs_status)
SET status = 'processing', worker_id = :worker_id, claim_token = {claim_token},
    attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE rowid IN (
    SELECT rid FROM cand ORDER BY priority DESC, lease_until, id LIMIT :limit)
  AND queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
RETURNING *;

-- The front of a key-limited queue: its first :window claimable jobs in claim order, with
-- their keys (limits.first_within_key_limits decides the claim from these when it can). The
-- same walk of leaseq_jobs_claimable as the plain claim's. A lapsed job whose new revision
-- names another key (stale, next_concurrency_key: enqueue.sql) is counted under the key it
-- will run with.
-- name: keyed_window
SELECT rowid AS rid,
       CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END AS concurrency_key
FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY priority DESC, lease_until, id
LIMIT :window;

-- The running jobs of each key in :keys (a JSON array), counted in leaseq_jobs_keyed_running
-- no further than :key_limit (the key is full then, however many run).
-- name: keys_running
SELECT k.value AS concurrency_key, (SELECT count(*) FROM (
        SELECT 1 FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
        WHERE r.queue = :queue AND r.concurrency_key = k.value
          AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
        LIMIT :key_limit)) AS running
FROM json_each(:keys) k;

-- The jobs a key-limited claim chose from the queue's front (:rids, a JSON array of rowids),
-- each still claimable (nothing else wrote since: the same BEGIN IMMEDIATE).
-- name: claim_rowids
UPDATE leaseq_jobs NOT INDEXED  -- by rowid (else the planner walks leaseq_jobs_status)
SET status = 'processing', worker_id = :worker_id, claim_token = {claim_token},
    attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE rowid IN (SELECT value FROM json_each(:rids))
  AND queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
RETURNING *;

-- The limits a key-limited claim without a rate runs with, recorded only when they changed
-- (the claim needs no rate log, so nothing is read first).
-- name: record_key_limit
INSERT INTO leaseq_limits (queue, key_limit, rate_per_s) VALUES (:queue, :key_limit, NULL)
ON CONFLICT (queue) DO UPDATE SET key_limit = excluded.key_limit, rate_per_s = NULL
WHERE key_limit IS NOT excluded.key_limit OR rate_per_s IS NOT NULL;

-- name: limits_row
SELECT recent, key_limit, rate_per_s, {now} AS now FROM leaseq_limits WHERE queue = :queue;

-- name: limited_queues
SELECT queue, key_limit, rate_per_s FROM leaseq_limits
WHERE key_limit IS NOT NULL OR rate_per_s IS NOT NULL;

-- name: forget_limits
UPDATE leaseq_limits SET key_limit = NULL, rate_per_s = NULL
WHERE queue = :queue AND (key_limit IS NOT NULL OR rate_per_s IS NOT NULL);

-- name: save_limits
INSERT INTO leaseq_limits (queue, recent, key_limit, rate_per_s)
VALUES (:queue, :recent, :key_limit, :rate_per_s)
ON CONFLICT (queue) DO UPDATE
SET recent = excluded.recent, key_limit = excluded.key_limit, rate_per_s = excluded.rate_per_s;

-- Per key with ready jobs: how many are ready and how many run under a lease that has not run
-- out (held_back: a lapsed one is ready, and the next sweep frees its slot).
-- name: key_backlog
SELECT concurrency_key,
       sum(status = 'processing' AND lease_until >= {now}) AS running,
       sum(attempts < max_attempts AND lease_until <= {now}
           AND (status = 'pending' OR lease_until < {now})) AS ready
FROM leaseq_jobs
WHERE queue = :queue AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
GROUP BY concurrency_key;

-- One job's key (the one it will run with: a lapsed stale job's next_concurrency_key) and
-- how many of that key are processing (claim_one under a key limit).
-- name: job_key_running
SELECT k.concurrency_key,
       (SELECT count(*) FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
        WHERE r.queue = :queue AND r.concurrency_key = k.concurrency_key
          AND r.concurrency_key IS NOT NULL AND r.status = 'processing') AS running
FROM (SELECT CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END AS concurrency_key
      FROM leaseq_jobs WHERE queue = :queue AND id = :id) k;

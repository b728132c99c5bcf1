-- PostgreSQL queries of leaseq: limits (placeholders as described in common.sql).

-- --- limits in the claim (docs/limits.md) ---------------------------------------------------
-- A limited claim is one transaction: it locks its queue's limits row first (limit_lock, or
-- key_limit_lock for a key limit alone), so every count the claim statement reads next (a new
-- snapshot, READ COMMITTED) stays true until it commits: no other limited claim of the queue
-- runs in between. Finishes take no lock; they only lower the counts.

-- name: limit_row
INSERT INTO {limits} (queue) VALUES (%(queue)s) ON CONFLICT (queue) DO NOTHING;

-- clock_timestamp(), not now(): the stamp of a claim that waited on the lock is the time it
-- got it (limits.stamp keeps stamps from going backwards).
-- name: limit_lock
SELECT recent, key_limit, rate_per_s,
       extract(epoch FROM clock_timestamp())::float8 + %(off)s AS now
FROM {limits} WHERE queue = %(queue)s
FOR UPDATE;

-- The lock of a key-limited claim without a rate (it needs no clock and no rate log), in one
-- statement: makes the queue's limits row on first use and records the limits the claim runs
-- with, written only when they changed. ON CONFLICT DO UPDATE locks the row even when its
-- WHERE is false (a row lock that conflicts with limit_lock's FOR UPDATE and with itself), so
-- this takes the same turn as limit_lock does.
-- name: key_limit_lock
INSERT INTO {limits} AS l (queue, key_limit, rate_per_s)
VALUES (%(queue)s, %(key_limit)s::integer, NULL)
ON CONFLICT (queue) DO UPDATE
SET key_limit = excluded.key_limit, rate_per_s = NULL
WHERE l.key_limit IS DISTINCT FROM excluded.key_limit OR l.rate_per_s IS NOT NULL;

-- name: save_limits
UPDATE {limits}
SET recent = %(recent)s::float8[], key_limit = %(key_limit)s, rate_per_s = %(rate_per_s)s
WHERE queue = %(queue)s;

-- The key-limited claim, in one statement: a loose index scan of jobs_keyed gives each key
-- with live jobs (one probe per key: ORDER BY ... LIMIT 1, not min(), which on a young
-- table's statistics was planned as an aggregate over every live keyed job); per key, its
-- count in jobs_keyed_running (read no further than key_limit) gives its free slots and a
-- walk of jobs_keyed its first ready jobs; jobs without a key come from the front of
-- jobs_claimable (among the first `scan` of them, limits.UNKEYED_SCAN). The best `limit` of
-- those, in claim order, are taken. The predicates repeat the partial indexes'.
-- The per-key walk tests `attempts + 0 < max_attempts`, which jobs_claimable's predicate does
-- not imply: so it can only walk jobs_keyed, the key's own entries in claim order (on a young
-- table the planner chose jobs_claimable and read every key's jobs for each key).
-- The chosen jobs are chosen from the statement's snapshot, so each is locked with the ready
-- predicates again: a job that left the ready set since (cancelled, or finished by the holder
-- of a lease that ran out) is rechecked on its newest version when locked, and skipped. Each
-- is locked by its own primary-key probe (LATERAL), and updated by the row version it locked
-- (ctid): joined by id instead, a young table's statistics (a queue of "6 rows") made the
-- planner read the whole queue into a hash join, for the lock and again for the update.
-- A lapsed job whose new revision names another key (stale, next_concurrency_key:
-- enqueue.sql) is not taken here, where it is found under its old key: the sweep's reclaim
-- (return_expired) makes it pending under the new key, and a later claim counts it there.
-- Without a key now, it is one of the jobs without a key.
-- name: claim_keyed
WITH RECURSIVE keys(k) AS (
    (SELECT concurrency_key FROM {jobs}
     WHERE queue = %(queue)s AND concurrency_key IS NOT NULL
       AND status IN ('pending', 'processing')
     ORDER BY concurrency_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.concurrency_key FROM {jobs} j
            WHERE j.queue = %(queue)s AND j.concurrency_key > keys.k
              AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing')
            ORDER BY j.concurrency_key LIMIT 1)
    FROM keys WHERE keys.k IS NOT NULL),
slots AS MATERIALIZED (
    SELECT k, %(key_limit)s - (
        SELECT count(*) FROM (
            SELECT 1 FROM {jobs} r
            WHERE r.queue = %(queue)s AND r.concurrency_key = keys.k
              AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
            LIMIT %(key_limit)s) running) AS free
    FROM keys WHERE k IS NOT NULL),
cand AS (
    SELECT c.id, c.priority, c.lease_until
    FROM slots CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.lease_until FROM {jobs} j
        WHERE j.queue = %(queue)s AND j.concurrency_key = slots.k
          AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing')
          AND j.attempts + 0 < j.max_attempts
          AND j.lease_until <= (SELECT {now})
          AND (j.status = 'pending' OR j.lease_until < (SELECT {now}))
          AND NOT (j.stale AND j.next_concurrency_key IS DISTINCT FROM j.concurrency_key)
        ORDER BY j.priority DESC, j.lease_until, j.id
        LIMIT least(slots.free, %(limit)s)) c
    WHERE slots.free > 0
    UNION ALL
    SELECT f.id, f.priority, f.lease_until FROM (
        SELECT id, priority, lease_until,
               CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END AS concurrency_key
        FROM {jobs}
        WHERE queue = %(queue)s
          AND status IN ('pending', 'processing') AND attempts < max_attempts
          AND lease_until <= (SELECT {now})
          AND (status = 'pending' OR lease_until < (SELECT {now}))
        ORDER BY priority DESC, lease_until, id
        LIMIT %(scan)s) f
    WHERE f.concurrency_key IS NULL),
best AS (
    SELECT id FROM cand ORDER BY priority DESC, lease_until, id LIMIT %(limit)s),
c AS (
    SELECT l.tid FROM best CROSS JOIN LATERAL (
        SELECT j.ctid AS tid, j.status, j.attempts, j.max_attempts, j.lease_until, j.stale,
               j.next_concurrency_key, j.concurrency_key
        FROM {jobs} j WHERE j.queue = %(queue)s AND j.id = best.id
        LIMIT 1 FOR UPDATE SKIP LOCKED) l
    WHERE l.status IN ('pending', 'processing') AND l.attempts < l.max_attempts
      AND l.lease_until <= (SELECT {now})
      AND (l.status = 'pending' OR l.lease_until < (SELECT {now}))
      AND NOT (l.stale AND l.next_concurrency_key IS DISTINCT FROM l.concurrency_key)),
taken AS (
    UPDATE {jobs} j
    SET status = 'processing', worker_id = %(worker_id)s, claim_token = %(token)s,
        attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now},
        concurrency_key = CASE WHEN j.stale THEN j.next_concurrency_key ELSE j.concurrency_key END
    WHERE j.ctid = ANY(ARRAY(SELECT tid FROM c))
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken ORDER BY id)
SELECT * FROM taken ORDER BY lease_until, id;

-- name: limits_row
SELECT l.recent, l.key_limit, l.rate_per_s, extract(epoch FROM {now})::float8 AS now
FROM (SELECT 1) one LEFT JOIN {limits} l ON l.queue = %(queue)s;

-- The first limited claim of a queue makes its row before it knows the limits: rows without
-- any are left out.
-- name: forget_limits
UPDATE {limits} SET key_limit = NULL, rate_per_s = NULL
WHERE queue = %(queue)s AND (key_limit IS NOT NULL OR rate_per_s IS NOT NULL);

-- name: limited_queues
SELECT queue, key_limit, rate_per_s FROM {limits}
WHERE key_limit IS NOT NULL OR rate_per_s IS NOT NULL;

-- Per key with live jobs: how many are ready and how many are processing under a lease that
-- has not run out (held_back: a lapsed one is ready, and the next sweep frees its slot).
-- name: key_backlog
SELECT concurrency_key,
       count(*) FILTER (WHERE status = 'processing' AND lease_until >= {now}) AS running,
       count(*) FILTER (WHERE attempts < max_attempts AND lease_until <= {now}
                        AND (status = 'pending' OR lease_until < {now})) AS ready
FROM {jobs}
WHERE queue = %(queue)s AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
GROUP BY concurrency_key;

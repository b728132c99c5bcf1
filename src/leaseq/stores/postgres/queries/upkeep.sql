-- PostgreSQL queries of leaseq: upkeep (placeholders as described in common.sql).

-- Step 1 of reclaim: spent jobs are buried before step 2 can make them pending.
-- name: expire_spent
WITH spent AS (
    UPDATE {jobs}
    SET status = 'failed', failure = 'expired', lease_until = NULL, updated_at = {now},
        error = replace(replace(%(lease_expired_on)s::text, '{attempt}', attempts::text),
                        '{max_attempts}', max_attempts::text)
                || coalesce(replace(%(held_by)s::text, '{worker}', worker_id), '')
    WHERE queue = %(queue)s AND status = 'processing' AND attempts >= max_attempts
      AND lease_until < {now}
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           {reason.expired}
    FROM spent ORDER BY id)
SELECT count(*) AS n FROM spent;

-- name: return_expired
WITH returned AS (
    UPDATE {jobs}
    SET status = 'pending', lease_until = {now}, stale = false, published_at = NULL,
        updated_at = {now},
        concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
    WHERE queue = %(queue)s AND status = 'processing' AND attempts < max_attempts
      AND lease_until < {now}
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.reclaimed}, attempts, lease_epoch, worker_id,
           {reason.lease_expired}
    FROM returned ORDER BY id)
SELECT count(*) AS n FROM returned;

-- Step 3 of reclaim: a pending job with its attempts spent can never be claimed (data written
-- before a new revision reset them); quarantine it. The predicate is the partial index's.
-- name: exhaust_pending
WITH stuck AS (
    UPDATE {jobs}
    SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
        error = replace(replace(%(spent_while_pending)s::text, '{attempt}', attempts::text),
                        '{max_attempts}', max_attempts::text)
    WHERE queue = %(queue)s AND status = 'pending' AND attempts >= max_attempts
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           {reason.spent_while_pending}
    FROM stuck ORDER BY id)
SELECT count(*) AS n FROM stuck;

-- SQLite queries of leaseq: upkeep (placeholders as described in common.sql).

-- Step 1 of reclaim: spent jobs are buried before step 2 can make them pending.
-- name: expire_spent
UPDATE leaseq_jobs
SET status = 'failed', failure = 'expired', lease_until = NULL, updated_at = {now},
    error = replace(replace(:lease_expired_on, '{attempt}', attempts),
                    '{max_attempts}', max_attempts)
            || coalesce(replace(:held_by, '{worker}', worker_id), '')
WHERE queue = :queue AND status = 'processing' AND attempts >= max_attempts
  AND lease_until < {now}
RETURNING id, attempts, lease_epoch, worker_id;

-- name: return_expired
UPDATE leaseq_jobs
SET status = 'pending', lease_until = {now}, stale = 0, published_at = NULL, updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE queue = :queue AND status = 'processing' AND attempts < max_attempts
  AND lease_until < {now}
RETURNING id, attempts, lease_epoch, worker_id;

-- Step 3 of reclaim: a pending job with its attempts spent can never be claimed (data written
-- before a new revision reset them); quarantine it. The predicate is the partial index's.
-- name: exhaust_pending
UPDATE leaseq_jobs
SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
    error = replace(replace(:spent_while_pending, '{attempt}', attempts),
                    '{max_attempts}', max_attempts)
WHERE queue = :queue AND status = 'pending' AND attempts >= max_attempts
RETURNING id, attempts, lease_epoch, worker_id;

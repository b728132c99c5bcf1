-- SQLite queries of leaseq: claim (placeholders as described in common.sql).

-- The inner SELECT repeats the partial index's predicate word for word so SQLite uses it; it
-- hands the UPDATE rowids, which find the rows with no second walk of the (queue, id) key.
-- name: claim
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, claim_token = {claim_token},
    attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE rowid IN (
    SELECT rowid FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    ORDER BY priority DESC, lease_until, id
    LIMIT :limit)
RETURNING *;

-- name: claim_one
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, claim_token = {claim_token},
    attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE queue = :queue AND id = :id
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND (lease_until IS NULL OR (lease_until <= {now} AND (status = 'pending' OR lease_until < {now})))
RETURNING *;

-- :leases is a JSON array of [id, lease_epoch, worker_id, claim_token] (worker_id or
-- claim_token null: unchecked).
-- name: heartbeat
WITH l AS MATERIALIZED (  -- materialized so the plan drives from the leases into the primary key
    SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS lease_epoch,
           json_extract(value, '$[2]') AS worker_id, json_extract(value, '$[3]') AS claim_token
    FROM json_each(:leases))
UPDATE leaseq_jobs
SET lease_until = {now} + :lease_s
FROM l
WHERE leaseq_jobs.queue = :queue AND leaseq_jobs.id = l.id
  AND leaseq_jobs.lease_epoch = l.lease_epoch AND leaseq_jobs.status = 'processing'
  AND (l.worker_id IS NULL OR leaseq_jobs.worker_id = l.worker_id)
  AND (l.claim_token IS NULL OR leaseq_jobs.claim_token = l.claim_token)
RETURNING leaseq_jobs.id, leaseq_jobs.lease_epoch, leaseq_jobs.claim_token;

-- The status goes into the reason last, so no text of it is read as a template field. Once
-- per lease, as on PostgreSQL: a beat of a lease already told lost (a retried write, a caller
-- that beats again) adds none.
-- name: journal_heartbeat_lost
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, reason)
SELECT queue, id, {now}, {event.heartbeat_lost}, attempts, :lease_epoch,
       replace(replace(replace(:lease_lost, '{lease_epoch}', :lease_epoch),
                       '{job_epoch}', lease_epoch), '{status}', status)
FROM leaseq_jobs j WHERE queue = :queue AND id = :id
  AND NOT EXISTS (SELECT 1 FROM leaseq_journal o
                  WHERE o.queue = j.queue AND o.job_id = j.id
                    AND o.event = {event.heartbeat_lost} AND o.lease_epoch = :lease_epoch);

-- name: any_ready
SELECT 1 AS ready FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
LIMIT 1;

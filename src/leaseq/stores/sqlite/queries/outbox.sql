-- SQLite queries of leaseq: outbox (placeholders as described in common.sql).

-- Repeats leaseq_jobs_outbox's predicate word for word so SQLite uses it: a walk of the jobs
-- still owed a publish, never of the published ones waiting for a consumer.
-- name: outbox_due
SELECT * FROM leaseq_jobs
WHERE queue = :queue
  AND status = 'pending' AND published_at IS NULL AND attempts < max_attempts
  AND lease_until <= {now}
ORDER BY lease_until, id LIMIT :limit;

-- name: republish
UPDATE leaseq_jobs SET published_at = NULL
WHERE queue = :queue AND status = 'pending' AND published_at < {now} - :published_before_s;

-- name: mark_published
-- Only the state that was published: still due (a not-yet-due retry is owed its own publish)
-- and at the epoch read by outbox_due (a claim and give-back in between bumped it, and that
-- later pending state has no message behind it), and not changed since (:as_of, the newest
-- updated_at read, or NULL: a cancel and requeue, or a new delay, keep the epoch, and the
-- message may have been acked as not claimable meanwhile). :leases is a JSON array of
-- [id, epoch].
UPDATE leaseq_jobs SET published_at = {now}
WHERE queue = :queue AND status = 'pending' AND published_at IS NULL AND lease_until <= {now}
  AND (:as_of IS NULL OR updated_at <= :as_of)
  AND (id, lease_epoch) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:leases))
RETURNING id, attempts, lease_epoch;

-- name: reowe_publish
-- Only a job still pending with its publish marked: any other state was settled, or is owed
-- already, and needs no second message. :ids is a JSON array of ids.
UPDATE leaseq_jobs SET published_at = NULL
WHERE queue = :queue AND status = 'pending' AND published_at IS NOT NULL
  AND id IN (SELECT value FROM json_each(:ids))
RETURNING id, attempts, lease_epoch;

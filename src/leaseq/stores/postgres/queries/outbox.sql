-- PostgreSQL queries of leaseq: outbox (placeholders as described in common.sql).

-- An ordered walk of jobs_outbox (its predicate repeated here) that stops after LIMIT rows;
-- the published jobs waiting for a consumer are not in it. The clock in a sub-select for the
-- same reason as in claim.
-- name: outbox_due
SELECT * FROM {jobs}
WHERE queue = %(queue)s AND status = 'pending' AND published_at IS NULL
  AND attempts < max_attempts AND lease_until <= (SELECT {now})
ORDER BY lease_until, id LIMIT %(limit)s;

-- Only a due job: a stale dispatcher's confirmation must not mark a retry not yet due.
-- name: republish
WITH cleared AS (
    UPDATE {jobs} SET published_at = NULL
    WHERE queue = %(queue)s AND status = 'pending'
      AND published_at < {now} - make_interval(secs => %(published_before_s)s)
    RETURNING id)
SELECT count(*) AS n FROM cleared;

-- Only the state that was published: still due and at the epoch outbox_due read (see the
-- SQLite twin of this query).
-- name: mark_published
WITH l AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS l(id, lease_epoch)),
marked AS (
    UPDATE {jobs} j SET published_at = {now}
    FROM l
    WHERE j.queue = %(queue)s AND j.id = l.id AND j.lease_epoch = l.lease_epoch
      AND j.status = 'pending' AND j.published_at IS NULL AND j.lease_until <= {now}
    RETURNING j.queue, j.id, j.attempts, j.lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch)
    SELECT queue, id, {now}, {event.published}, attempts, lease_epoch FROM marked ORDER BY id)
SELECT id FROM marked;

-- Only a job still pending with its publish marked (see the SQLite twin of this query).
-- name: reowe_publish
WITH owed AS (
    UPDATE {jobs} SET published_at = NULL
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[]) AND status = 'pending'
      AND published_at IS NOT NULL
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, %(event)s, attempts, lease_epoch, %(reason)s FROM owed ORDER BY id)
SELECT id FROM owed;

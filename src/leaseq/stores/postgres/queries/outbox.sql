-- PostgreSQL queries of leaseq: outbox (placeholders as described in common.sql).

-- An ordered walk of jobs_outbox (create_outbox_index below; its predicate repeated here)
-- that stops after LIMIT rows; the published jobs waiting for a consumer are not in it. Where
-- no dispatcher built that index (a doctor's read) it walks jobs_claimable instead. The clock
-- in a sub-select for the same reason as in claim.
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

-- Only the state that was published: still due, at the epoch outbox_due read and not changed
-- since (see the SQLite twin of this query).
-- name: mark_published
WITH l AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS l(id, lease_epoch)),
marked AS (
    UPDATE {jobs} j SET published_at = {now}
    FROM l
    WHERE j.queue = %(queue)s AND j.id = l.id AND j.lease_epoch = l.lease_epoch
      AND j.status = 'pending' AND j.published_at IS NULL AND j.lease_until <= {now}
      AND (%(as_of)s::timestamptz IS NULL OR j.updated_at <= %(as_of)s::timestamptz)
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

-- --- the outbox's index, built on demand (prepare_outbox; migration 012 says why) -----------

-- jobs_outbox: only the jobs still owed a publish, in outbox_due's order (outbox_due repeats
-- this predicate so the planner can use it). In broker mode most pending jobs are published
-- and only wait for a consumer; walking them in jobs_claimable cost a step per published job
-- on every dispatcher round (26 ms at 200,000). CONCURRENTLY: writes to the table go on while
-- it is built; it cannot run inside a transaction.
-- name: create_outbox_index
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_outbox ON {jobs} (queue, lease_until, id)
    WHERE status = 'pending' AND published_at IS NULL AND attempts < max_attempts;

-- true when jobs_outbox is usable; false when a concurrent build failed or was cut and left it
-- INVALID (IF NOT EXISTS would keep it, no query reads it, and writes may still pay for it);
-- no row when there is none.
-- name: outbox_index_valid
SELECT indisvalid AS valid FROM pg_index WHERE indexrelid = to_regclass('{schema}.jobs_outbox');

-- name: drop_outbox_index
DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_outbox;

-- One builder per schema. Tried, never waited on inside the server: a session blocked in
-- pg_advisory_lock holds a snapshot, which the concurrent build waits for in its last phase
-- while the waiter waits for the builder's lock; PostgreSQL ends that deadlock by failing the
-- build, which leaves the INVALID index behind.
-- name: try_lock_outbox_index
SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0)) AS taken;

-- name: unlock_outbox_index
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS released;

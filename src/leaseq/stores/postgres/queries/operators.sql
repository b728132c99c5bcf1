-- PostgreSQL queries of leaseq: operators (placeholders as described in common.sql).

-- name: operator_requeue
WITH changed AS (
    UPDATE {jobs}
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, failure = NULL,
        stale = false, worker_id = NULL,
        lease_until = {now}, published_at = NULL, updated_at = {now}
    WHERE queue = %(queue)s AND id = %(id)s AND status NOT IN ('pending', 'processing')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, {event.requeued}, attempts, lease_epoch, {reason.operator}
    FROM changed)
SELECT count(*) AS n FROM changed;

-- name: operator_cancel
WITH changed AS (
    UPDATE {jobs}
    SET status = 'cancelled', lease_until = NULL, stale = false, updated_at = {now},
        concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
    WHERE queue = %(queue)s AND id = %(id)s AND status IN ('pending', 'processing', 'failed')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, {event.cancelled}, attempts, lease_epoch, {reason.operator}
    FROM changed)
SELECT count(*) AS n FROM changed;

-- name: exists
SELECT 1 AS found FROM {jobs} WHERE queue = %(queue)s AND id = %(id)s;

-- One batch (PURGE_BATCH jobs at most, found through jobs_status) of a purge of one status.
-- The delete tests the status and age again: a job requeued since it was found is not deleted.
-- (It answers how many it found too: a batch another purge or a requeue thinned out is not
-- the last one.)
-- name: purge
WITH found AS (
    SELECT id FROM {jobs}
    WHERE queue = %(queue)s AND status = %(status)s
      AND updated_at < {now} - make_interval(secs => %(age_s)s)
    LIMIT %(batch)s),
gone AS (
    DELETE FROM {jobs} j
    WHERE j.queue = %(queue)s AND j.id IN (SELECT id FROM found) AND j.status = %(status)s
      AND j.updated_at < {now} - make_interval(secs => %(age_s)s)
    RETURNING j.id),
log AS (
    DELETE FROM {journal}
    WHERE queue = %(queue)s AND job_id IN (SELECT id FROM gone))
SELECT (SELECT count(*) FROM gone) AS n, (SELECT count(*) FROM found) AS found;

-- --- operators' tools: job browser, bulk actions, journal per hour, worker registry -------

-- The browser's index walks. Each returns the sort key, the id and whether the row passes the
-- filters the index does not bound (task, prefix, error text, the time range; NULL = any);
-- browse.walk stops them at a row cap. after_k / after_id are the last row seen.
-- name: walk_status
SELECT updated_at AS k, id,
       ((%(task)s::text IS NULL OR task = %(task)s)
        AND (%(prefix)s::text IS NULL OR left(id, length(%(prefix)s)) = %(prefix)s)
        AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)) AS hit
FROM {jobs}
WHERE queue = %(queue)s AND status = %(status)s
  AND updated_at >= %(since)s AND updated_at < %(until)s
  AND (updated_at, id) < (%(after_k)s::timestamptz, %(after_id)s::text)
ORDER BY updated_at DESC, id DESC
LIMIT %(n)s;

-- The walk in id order, over the primary key: every filter without a status (a task too: no
-- index on task, see migration 014); an id prefix bounds it.
-- name: walk_ids
SELECT NULL AS k, id,
       ((%(task)s::text IS NULL OR task = %(task)s)
        AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
        AND updated_at >= %(since)s AND updated_at < %(until)s) AS hit
FROM {jobs}
WHERE queue = %(queue)s AND id > %(after_id)s AND id >= %(low)s AND id < %(high)s
ORDER BY id
LIMIT %(n)s;

-- name: get_many
SELECT * FROM {jobs} WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[]);

-- name: bulk_requeue
WITH changed AS (
    UPDATE {jobs}
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, failure = NULL,
        stale = false, worker_id = NULL, lease_until = {now}, published_at = NULL,
        updated_at = {now}
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
      AND status NOT IN ('pending', 'processing')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, %(event)s, attempts, lease_epoch, %(reason)s
    FROM changed ORDER BY id)
SELECT id FROM changed;

-- name: bulk_cancel
WITH changed AS (
    UPDATE {jobs}
    SET status = 'cancelled', lease_until = NULL, stale = false, updated_at = {now},
        concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
      AND status IN ('pending', 'processing', 'failed')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, %(event)s, attempts, lease_epoch, %(reason)s
    FROM changed ORDER BY id)
SELECT id FROM changed;

-- A deleted job's story outlives its record: a creation the record told (see journal in
-- read.sql; none of this life, at or after its created_at, in the journal) is written at seq
-- 0 (the first life; each later one below the last: seq is the journal's key), which the
-- story's read places after the lives before it.
-- name: bulk_delete
WITH changed AS (
    DELETE FROM {jobs}
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
      AND status NOT IN ('pending', 'processing')
    RETURNING queue, id, attempts, lease_epoch, created_at),
born AS (
    INSERT INTO {journal} (seq, queue, job_id, at, event, reason)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce((SELECT min(b.seq) - 1 FROM {journal} b
                     WHERE b.queue = c.queue AND b.job_id = c.id AND b.seq <= 0), 0),
           c.queue, c.id, c.created_at, {event.enqueued}, {created} FROM changed c
    WHERE NOT EXISTS (SELECT 1 FROM {journal} j
                      WHERE j.queue = c.queue AND j.job_id = c.id
                        AND j.event = {event.enqueued} AND j.reason = {created}
                        AND j.at >= c.created_at)),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, %(event)s, attempts, lease_epoch, %(reason)s
    FROM changed ORDER BY id)
SELECT id FROM changed;

-- name: requeue_edited
WITH changed AS (
    UPDATE {jobs}
    SET payload = %(payload)s::json, status = 'pending', attempts = 0, snoozes = 0,
        givebacks = 0, failure = NULL, stale = false, worker_id = NULL, lease_until = {now},
        published_at = NULL, updated_at = {now}
    WHERE queue = %(queue)s AND id = %(id)s AND status NOT IN ('pending', 'processing')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, e.event, attempts, lease_epoch, %(reason)s
    FROM changed, (VALUES (1, {event.edited}), (2, {event.requeued})) AS e(n, event) ORDER BY e.n)
SELECT id FROM changed;

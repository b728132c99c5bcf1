-- SQLite queries of leaseq: operators (placeholders as described in common.sql).

-- name: operator_requeue
UPDATE leaseq_jobs
SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, failure = NULL, stale = 0,
    worker_id = NULL,
    lease_until = {now}, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND status NOT IN ('pending', 'processing')
RETURNING attempts, lease_epoch;

-- name: operator_cancel
UPDATE leaseq_jobs
SET status = 'cancelled', lease_until = NULL, stale = 0, updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE queue = :queue AND id = :id AND status IN ('pending', 'processing', 'failed')
RETURNING attempts, lease_epoch;

-- name: exists
SELECT 1 FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- The jobs first, then the journal of exactly those: two statements reading the clock each
-- left the journal of a job that came of age between them.
-- One batch (PURGE_BATCH jobs at most) of a purge, found through leaseq_jobs_status.
-- name: purge_jobs
DELETE FROM leaseq_jobs
WHERE rowid IN (SELECT rowid FROM leaseq_jobs
                WHERE queue = :queue AND status = :status AND updated_at < {now} - :older_than_s
                LIMIT :batch)
RETURNING id;

-- name: purge_journal
DELETE FROM leaseq_journal
WHERE queue = :queue AND job_id IN (SELECT value FROM json_each(:ids));

-- --- operators' tools: job browser, bulk actions, journal per hour, worker registry -------

-- The browser's index walks. Each returns the sort key, the id and whether the row passes the
-- filters the index does not bound (:task, :prefix, :error, the time range; NULL = any);
-- browse.walk stops them at a row cap. :after_k / :after_id are the last row seen.
-- name: walk_status
SELECT updated_at AS k, id,
       ((:task IS NULL OR task = :task)
        AND (:prefix IS NULL OR substr(id, 1, length(:prefix)) = :prefix)
        AND (:error IS NULL OR instr(lower(error), lower(:error)) > 0)) AS hit
FROM leaseq_jobs
WHERE queue = :queue AND status = :status AND updated_at >= :since AND updated_at < :until
  AND (updated_at, id) < (:after_k, :after_id)
ORDER BY updated_at DESC, id DESC
LIMIT :n;

-- name: walk_task
SELECT NULL AS k, id,
       ((:prefix IS NULL OR substr(id, 1, length(:prefix)) = :prefix)
        AND (:error IS NULL OR instr(lower(error), lower(:error)) > 0)
        AND updated_at >= :since AND updated_at < :until) AS hit
FROM leaseq_jobs
WHERE queue = :queue AND task = :task AND id > :after_id
ORDER BY id
LIMIT :n;

-- name: walk_ids
SELECT NULL AS k, id,
       ((:error IS NULL OR instr(lower(error), lower(:error)) > 0)
        AND updated_at >= :since AND updated_at < :until) AS hit
FROM leaseq_jobs
WHERE queue = :queue AND id > :after_id AND id >= :low AND id < :high
ORDER BY id
LIMIT :n;

-- :ids is a JSON array of ids.
-- name: get_many
SELECT * FROM leaseq_jobs WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids));

-- name: bulk_requeue
UPDATE leaseq_jobs
SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, failure = NULL, stale = 0,
    worker_id = NULL, lease_until = {now}, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND status NOT IN ('pending', 'processing')
RETURNING id, attempts, lease_epoch;

-- name: bulk_cancel
UPDATE leaseq_jobs
SET status = 'cancelled', lease_until = NULL, stale = 0, updated_at = {now},
    concurrency_key = CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND status IN ('pending', 'processing', 'failed')
RETURNING id, attempts, lease_epoch;

-- name: bulk_delete
DELETE FROM leaseq_jobs
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND status NOT IN ('pending', 'processing')
RETURNING id, attempts, lease_epoch;

-- name: requeue_edited
UPDATE leaseq_jobs
SET payload = :payload, status = 'pending', attempts = 0, snoozes = 0, givebacks = 0,
    failure = NULL, stale = 0, worker_id = NULL, lease_until = {now}, published_at = NULL,
    updated_at = {now}
WHERE queue = :queue AND id = :id AND status NOT IN ('pending', 'processing')
RETURNING id, attempts, lease_epoch;

-- SQLite queries of leaseq: read (placeholders as described in common.sql).

-- name: get
SELECT * FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- name: list_jobs
SELECT * FROM leaseq_jobs
WHERE queue = :queue AND (:status IS NULL OR status = :status) AND id > :after_id
ORDER BY id LIMIT :limit;

-- name: counts
SELECT status, count(*) AS n FROM leaseq_jobs WHERE queue = :queue GROUP BY status;

-- name: ready
SELECT count(*) AS n, {now} - min(lease_until) AS age FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now});

-- name: in_flight
SELECT count(*) AS n FROM leaseq_jobs
WHERE queue = :queue AND status = 'processing' AND lease_until > {now};

-- name: journal
SELECT * FROM leaseq_journal WHERE queue = :queue AND job_id = :id ORDER BY seq;

-- name: append_journal
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason, data)
VALUES (:queue, :id, {now}, :event, :attempt, :lease_epoch, :worker_id, :reason, :data);

-- The journal rows of a claim or a batch completion in one statement, read from the rows the
-- statement just wrote (the write lock is still held): no Python per row. :ids is a JSON array.
-- name: journal_claims
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
       CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
FROM leaseq_jobs WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids));

-- name: journal_results
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
SELECT queue, id, {now}, {event.result_saved}, attempts, lease_epoch, worker_id, status
FROM leaseq_jobs WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids));

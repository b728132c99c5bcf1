-- PostgreSQL queries of leaseq: read (placeholders as described in common.sql).

-- name: get
SELECT * FROM {jobs} WHERE queue = %(queue)s AND id = %(id)s;

-- name: list_jobs
SELECT * FROM {jobs}
WHERE queue = %(queue)s AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND id > %(after_id)s::text
ORDER BY id LIMIT %(limit)s;

-- name: counts
SELECT status, count(*) AS n FROM {jobs} WHERE queue = %(queue)s GROUP BY status;

-- name: ready
SELECT count(*) AS n, extract(epoch FROM {now} - min(lease_until))::float8 AS age
FROM {jobs}
WHERE queue = %(queue)s
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now});

-- name: in_flight
SELECT count(*) AS n FROM {jobs}
WHERE queue = %(queue)s AND status = 'processing' AND lease_until > {now};

-- A job's story. Its creation is written as a row only when it carries data (a revision) or
-- when the job is deleted (bulk_delete, at seq 0); otherwise the record tells it (created_at),
-- and the entry is read from there, as long as no creation row of this record's life exists
-- (one at or after its created_at: a job deleted and enqueued again has the old life's). An
-- entry at seq 0 or below (bulk_delete's) takes its place after the last row of the lives
-- before it (at < its at).
-- name: journal
SELECT seq, job_id, at, event, attempt, lease_epoch, worker_id, reason, data FROM (
    SELECT s.*,
           CASE WHEN s.seq <= 0 THEN coalesce(
               (SELECT max(o.seq) FROM {journal} o
                WHERE o.queue = %(queue)s AND o.job_id = %(id)s AND o.seq > 0 AND o.at < s.at),
               0) ELSE s.seq END AS place
    FROM (
        SELECT seq, job_id, at, event, attempt, lease_epoch, worker_id, reason, data
        FROM {journal} WHERE queue = %(queue)s AND job_id = %(id)s
        UNION ALL
        SELECT 0, j.id, j.created_at, {event.enqueued}, NULL, NULL, NULL, {created}, NULL
        FROM {jobs} j
        WHERE j.queue = %(queue)s AND j.id = %(id)s
          AND NOT EXISTS (SELECT 1 FROM {journal} c
                          WHERE c.queue = j.queue AND c.job_id = j.id
                            AND c.event = {event.enqueued} AND c.reason = {created}
                            AND c.at >= j.created_at)) s) story
ORDER BY place, seq <= 0;

-- name: append_journal
INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason, data)
VALUES (%(queue)s, %(id)s, {now}, %(event)s, %(attempt)s, %(lease_epoch)s, %(worker_id)s,
        %(reason)s, %(data)s::json);

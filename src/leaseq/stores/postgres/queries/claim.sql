-- PostgreSQL queries of leaseq: claim (placeholders as described in common.sql).

-- The inner SELECT repeats the partial index's predicate word for word so the planner can
-- use jobs_claimable; SKIP LOCKED lets concurrent claims pass each other's rows.
-- The clock is read in a sub-select (an InitPlan) on purpose: the planner then cannot estimate
-- "lease_until <= now" from the column's histogram, which counts the NULLs of every finished
-- job and, multiplied by the status clause, guesses a handful of due rows where there are
-- thousands; with that guess it would fetch every due row and sort them. Unestimated, the
-- ordered index scan that stops after LIMIT rows wins at any size.
-- name: claim
WITH c AS (
    SELECT id FROM {jobs}
    WHERE queue = %(queue)s
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= (SELECT {now})
      AND (status = 'pending' OR lease_until < (SELECT {now}))
    ORDER BY priority DESC, lease_until, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED),
taken AS (
    UPDATE {jobs} j
    SET status = 'processing', worker_id = %(worker_id)s, claim_token = %(token)s,
        attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now},
        concurrency_key = CASE WHEN j.stale THEN j.next_concurrency_key ELSE j.concurrency_key END
    FROM c WHERE j.queue = %(queue)s AND j.id = c.id
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken ORDER BY id)
SELECT * FROM taken ORDER BY lease_until, id;

-- Under a key limit (key_limit not NULL) the job's key is read from the row as locked (its
-- newest version: a revision that moved it to another key and committed meanwhile is seen),
-- and the job is taken only while that key has a free slot. Checked in a statement of its
-- own before, the key could change in between and the job ran in a key already full.
-- name: claim_one
WITH c AS (
    SELECT id, CASE WHEN stale THEN next_concurrency_key ELSE concurrency_key END AS k
    FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND (lease_until IS NULL
           OR (lease_until <= {now} AND (status = 'pending' OR lease_until < {now})))
    FOR UPDATE),
room AS (
    SELECT c.id FROM c
    WHERE CASE WHEN %(key_limit)s::integer IS NULL OR c.k IS NULL THEN true
               ELSE (SELECT count(*) FROM (
                         SELECT 1 FROM {jobs} r
                         WHERE r.queue = %(queue)s AND r.concurrency_key = c.k
                           AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
                         LIMIT %(key_limit)s) running) < %(key_limit)s END),
taken AS (
    UPDATE {jobs} j
    SET status = 'processing', worker_id = %(worker_id)s, claim_token = %(token)s,
        attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now},
        concurrency_key = CASE WHEN j.stale THEN j.next_concurrency_key ELSE j.concurrency_key END
    FROM room WHERE j.queue = %(queue)s AND j.id = room.id
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken)
SELECT * FROM taken;

-- What a claim whose answer was lost committed (session.py's read_back): the jobs it stamped
-- with its token and its worker still holds, their leases renewed, in the claim's order. A lease
-- that ran out meanwhile is left out (another worker may claim that job now). A walk of the
-- queue's processing jobs (jobs_status), as many as run at once.
-- name: claimed_by_token
WITH held AS (
    UPDATE {jobs}
    SET lease_until = {now} + make_interval(secs => %(lease_s)s)
    WHERE queue = %(queue)s AND status = 'processing' AND claim_token = %(token)s
      AND worker_id = %(worker_id)s AND lease_until > {now}
    RETURNING *)
SELECT * FROM held ORDER BY lease_until, id;

-- ids / epochs / holders / tokens are parallel arrays: one statement for every in-flight
-- lease (a NULL holder or token leaves it unchecked). A lost lease's reason fills the status
-- in last, so no text of the status is read as a template field.
-- name: heartbeat
WITH l AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[], %(holders)s::text[],
                         %(tokens)s::uuid[])
        AS l(id, lease_epoch, worker_id, claim_token)),
held AS (
    UPDATE {jobs} j
    SET lease_until = {now} + make_interval(secs => %(lease_s)s)
    FROM l
    WHERE j.queue = %(queue)s AND j.id = l.id AND j.lease_epoch = l.lease_epoch
      AND j.status = 'processing' AND (l.worker_id IS NULL OR j.worker_id = l.worker_id)
      AND (l.claim_token IS NULL OR j.claim_token = l.claim_token)
    RETURNING j.id, j.lease_epoch, j.claim_token),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT j.queue, j.id, {now}, {event.heartbeat_lost}, j.attempts, l.lease_epoch,
           replace(replace(replace(%(lease_lost)s::text,
                                   '{lease_epoch}', l.lease_epoch::text),
                           '{job_epoch}', j.lease_epoch::text),
                   '{status}', j.status)
    FROM l JOIN {jobs} j ON j.queue = %(queue)s AND j.id = l.id
    WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = l.id AND h.lease_epoch = l.lease_epoch
                        AND (l.claim_token IS NULL OR h.claim_token = l.claim_token))
      AND NOT EXISTS (SELECT 1 FROM {journal} o  -- once per lease: a retried beat adds none
                      WHERE o.queue = j.queue AND o.job_id = j.id
                        AND o.event = {event.heartbeat_lost} AND o.lease_epoch = l.lease_epoch))
SELECT id, lease_epoch, claim_token FROM held;

-- PostgreSQL queries of leaseq. {jobs} and {journal} are the store's schema-qualified tables;
-- {now} is the server's clock plus the test-only offset `off`. now() is the transaction's
-- start, so every use in one transaction agrees.
--
-- Every state change writes its journal rows in the same statement (a data-modifying CTE),
-- so a change and its event commit together and cost one round trip.
-- A fenced finish reads the row FOR UPDATE in a CTE (`old`) and then runs one of several
-- UPDATEs whose conditions exclude each other: the stale one gives the job back for its new
-- revision (restarted), the others finish.

-- name: now
SELECT {now} AS now;

-- A loose index scan over the primary key: one index probe per queue, from each queue name to
-- the next, instead of reading every job (SELECT DISTINCT scans the whole table). The
-- sweeper and the metrics ask.
-- name: queues
WITH RECURSIVE q(queue) AS (
    SELECT min(queue) FROM {jobs}
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL)
SELECT queue FROM q WHERE queue IS NOT NULL;

-- The common enqueue in one statement: ids that do not exist yet are inserted with their
-- journal rows and one NOTIFY (delivered at commit); exact replays (`unchanged`, the same rule
-- as decide_upsert, needing no lock since nothing is written for them) are reported. When any
-- existing id needs more (conflict, update, revive), nothing is written and the caller takes
-- the careful path. The INSERT has no ON CONFLICT on purpose: an id a concurrent enqueue
-- inserted after this statement's snapshot raises unique_violation, which aborts the whole
-- statement (no half-written batch) and sends the caller to the careful path too.
-- Each id is looked up in a sub-select of its own, planned for one id: a primary-key lookup
-- whatever the statistics say (a join, as a generic plan on a young table, would rather read
-- the whole queue). `unchanged` is NULL for an id not stored; OFFSET 0 keeps the CTE whole so
-- each lookup runs once. Never prepared, as it also runs on callers' own connections (whose
-- plan_cache_mode is theirs): a generic plan made while the table is young would do each lookup
-- as a sequential scan and keep doing so as the table grows (see _configure in session.py).
-- The last SELECT reads `note` so that the NOTIFY is evaluated.
-- name: enqueue_fast
WITH u AS (
    SELECT u.*, (SELECT CASE WHEN u.revision IS NOT NULL
                             THEN coalesce(j.revision = u.revision, false)
                             ELSE j.payload::text = u.payload END
                 FROM {jobs} j WHERE j.queue = %(queue)s AND j.id = u.id) AS unchanged
    FROM unnest(%(ids)s::text[], %(tasks)s::text[], %(payloads)s::text[],
                %(revisions)s::text[], %(delays)s::float8[], %(max_attempts)s::integer[],
                %(data)s::text[], %(priorities)s::integer[], %(keys)s::text[]) WITH ORDINALITY
        AS u(id, task, payload, revision, delay_s, max_attempts, data, priority,
             concurrency_key, n)
    OFFSET 0),
new AS (
    SELECT * FROM u
    WHERE unchanged IS NULL AND NOT EXISTS (SELECT 1 FROM u WHERE NOT unchanged)),
ins AS (
    INSERT INTO {jobs} (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                        lease_epoch, revision, created_at, updated_at, first_seen_at,
                        priority, concurrency_key)
    SELECT %(queue)s, id, task, 'pending', payload::json, 0, max_attempts,
           {now} + make_interval(secs => delay_s), 0, revision, {now}, {now}, {now},
           priority, concurrency_key
    FROM new ORDER BY id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, reason, data)
    SELECT %(queue)s, id, {now}, {event.enqueued}, 'created', data::json FROM new ORDER BY n),
note AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE EXISTS (SELECT 1 FROM new))
SELECT id, unchanged FROM u WHERE unchanged IS NOT NULL
UNION ALL
SELECT NULL, NULL FROM note;

-- enqueue_fast for one new job, with scalar parameters, prepared. The row exists already
-- (a replay, an update, a conflict, or a concurrent enqueue's insert): DO NOTHING on the
-- primary key writes nothing, and the caller takes the careful path. `inserted` is 1 when the
-- job, its journal row and its NOTIFY were written. No lookup to plan: the arbiter index is
-- the primary key by definition, so it runs on the session's second pool, where a prepared
-- statement keeps its generic plan (planning this one on every run cost as much as running
-- it). Only on leaseq's own connections: a caller's connection= takes enqueue_fast.
-- name: enqueue_one
WITH ins AS (
    INSERT INTO {jobs} (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                        lease_epoch, revision, created_at, updated_at, first_seen_at,
                        priority, concurrency_key)
    VALUES (%(queue)s, %(id)s, %(task)s, 'pending', %(payload)s::json, 0, %(max_attempts)s,
            {now} + make_interval(secs => %(delay_s)s), 0, %(revision)s, {now}, {now}, {now},
            %(priority)s, %(concurrency_key)s)
    ON CONFLICT (queue, id) DO NOTHING
    RETURNING id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, reason, data)
    SELECT %(queue)s, id, {now}, {event.enqueued}, 'created', %(data)s::json FROM ins),
note AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM ins)
SELECT count(*) AS inserted FROM note;

-- Locks the existing rows of one enqueue batch (in id order, so two batches can't deadlock).
-- name: find_existing
SELECT id, status, payload::text AS payload, revision FROM {jobs}
WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
ORDER BY id
FOR UPDATE;

-- A concurrent insert of the same id makes DO NOTHING skip it: the caller sees the id
-- missing from RETURNING and decides again under the row lock.
-- name: insert_jobs
INSERT INTO {jobs} (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                    lease_epoch, revision, created_at, updated_at, first_seen_at,
                    priority, concurrency_key)
SELECT %(queue)s, u.id, u.task, 'pending', u.payload::json, 0, u.max_attempts,
       {now} + make_interval(secs => u.delay_s), 0, u.revision, {now}, {now}, {now},
       u.priority, u.concurrency_key
FROM unnest(%(ids)s::text[], %(tasks)s::text[], %(payloads)s::text[], %(revisions)s::text[],
            %(delays)s::float8[], %(max_attempts)s::integer[], %(priorities)s::integer[],
            %(keys)s::text[])
     AS u(id, task, payload, revision, delay_s, max_attempts, priority, concurrency_key)
ORDER BY u.id
ON CONFLICT (queue, id) DO NOTHING
RETURNING id;

-- name: revive_job
UPDATE {jobs}
SET status = 'pending', payload = %(payload)s::json, task = %(task)s, revision = %(revision)s,
    max_attempts = %(max_attempts)s, attempts = 0, snoozes = 0, givebacks = 0, failure = NULL,
    result = NULL, result_key = NULL, stale = false, worker_id = NULL,
    lease_until = {now} + make_interval(secs => %(delay_s)s), published_at = NULL,
    updated_at = {now}, priority = %(priority)s, concurrency_key = %(concurrency_key)s
WHERE queue = %(queue)s AND id = %(id)s;

-- A new revision starts with a fresh budget: attempts kept from the old one could be at or
-- past the new max_attempts, and nothing would ever claim the job again.
-- name: update_pending
UPDATE {jobs}
SET payload = %(payload)s::json, task = %(task)s, revision = %(revision)s,
    max_attempts = %(max_attempts)s, attempts = 0, snoozes = 0, givebacks = 0,
    lease_until = {now} + make_interval(secs => %(delay_s)s),
    published_at = NULL, updated_at = {now}, priority = %(priority)s,
    concurrency_key = %(concurrency_key)s
WHERE queue = %(queue)s AND id = %(id)s;

-- A processing job keeps its lease; its worker's finish becomes a give-back (see base.py).
-- The running attempt belongs to the old revision, so the budget is reset now: an expired
-- lease then returns the job ready for the new revision instead of failing it as expired.
-- It keeps its concurrency key while it runs: the key's running count must not move.
-- name: mark_stale
UPDATE {jobs}
SET payload = %(payload)s::json, task = %(task)s, revision = %(revision)s,
    max_attempts = %(max_attempts)s, attempts = 0, snoozes = 0, givebacks = 0, stale = true,
    updated_at = {now}, priority = %(priority)s
WHERE queue = %(queue)s AND id = %(id)s;

-- name: journal_enqueued
INSERT INTO {journal} (queue, job_id, at, event, reason, data)
SELECT %(queue)s, u.id, {now}, {event.enqueued}, u.reason, u.data::json
FROM unnest(%(ids)s::text[], %(reasons)s::text[], %(data)s::text[]) WITH ORDINALITY
     AS u(id, reason, data, n)
ORDER BY u.n;

-- name: notify
SELECT pg_notify(%(channel)s, %(queue)s);

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
    SET status = 'processing', worker_id = %(worker_id)s, attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now}
    FROM c WHERE j.queue = %(queue)s AND j.id = c.id
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken ORDER BY id)
SELECT * FROM taken ORDER BY lease_until, id;

-- name: claim_one
WITH c AS (
    SELECT id FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND (lease_until IS NULL
           OR (lease_until <= {now} AND (status = 'pending' OR lease_until < {now})))
    FOR UPDATE),
taken AS (
    UPDATE {jobs} j
    SET status = 'processing', worker_id = %(worker_id)s, attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now}
    FROM c WHERE j.queue = %(queue)s AND j.id = c.id
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken)
SELECT * FROM taken;

-- ids / epochs are parallel arrays: one statement for every in-flight lease.
-- name: heartbeat
WITH l AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS l(id, lease_epoch)),
held AS (
    UPDATE {jobs} j
    SET lease_until = {now} + make_interval(secs => %(lease_s)s)
    FROM l
    WHERE j.queue = %(queue)s AND j.id = l.id AND j.lease_epoch = l.lease_epoch
      AND j.status = 'processing'
    RETURNING j.id, j.lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT j.queue, j.id, {now}, {event.heartbeat_lost}, j.attempts, l.lease_epoch,
           'lease epoch ' || l.lease_epoch || ' lost; job is ' || j.status
           || ' at epoch ' || j.lease_epoch
    FROM l JOIN {jobs} j ON j.queue = %(queue)s AND j.id = l.id
    WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = l.id AND h.lease_epoch = l.lease_epoch))
SELECT id, lease_epoch FROM held;

-- Completions, one or a batch (`complete` sends one item): each item fenced on its own by
-- id + lease_epoch + status processing; a stale one is given back for its new revision. Rows
-- are locked in id order so two batches never wait on each other in a cycle.
-- name: complete_many
WITH items AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[], %(statuses)s::text[],
                         %(results)s::text[], %(result_keys)s::text[])
        AS i(id, lease_epoch, status, result, result_key)),
old AS (
    SELECT j.id, j.stale, i.status, i.result, i.result_key
    FROM {jobs} j JOIN items i ON j.id = i.id AND j.lease_epoch = i.lease_epoch
    WHERE j.queue = %(queue)s AND j.status = 'processing'
    ORDER BY j.id
    FOR UPDATE OF j),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
finished AS (
    UPDATE {jobs} j
    SET status = old.status, result = old.result::json, result_key = old.result_key,
        failure = NULL, lease_until = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id,
           %(stale_reason)s::text
    FROM restarted
    UNION ALL
    SELECT queue, id, {now}, {event.result_saved}, attempts, lease_epoch, worker_id, status
    FROM finished)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM finished;

-- Three ways out, by the row as locked: stale → restarted; attempts spent → failed(exhausted);
-- otherwise back to pending after the delay.
-- name: retry_later
WITH old AS (
    SELECT id, stale, attempts >= max_attempts AS spent FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing'
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
exhausted AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = 'exhausted', error = %(error)s, lease_until = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale AND old.spent
    RETURNING j.*),
retried AS (
    UPDATE {jobs} j
    SET status = 'pending', error = %(error)s,
        lease_until = {now} + make_interval(secs => %(delay_s)s), published_at = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale AND NOT old.spent
    RETURNING j.*),
log AS (
    INSERT INTO {journal}
        (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason, data)
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id,
           %(stale_reason)s::text, NULL::json
    FROM restarted
    UNION ALL
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           'exhausted: ' || %(reason)s::text, NULL::json
    FROM exhausted
    UNION ALL
    SELECT queue, id, {now}, {event.retry_scheduled}, attempts, lease_epoch, worker_id, %(reason)s::text,
           %(data)s::json
    FROM retried)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM exhausted
UNION ALL
SELECT *, false FROM retried;

-- name: fail
WITH old AS (
    SELECT id, stale FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing'
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
failed AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = %(failure)s, error = %(error)s, lease_until = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id,
           %(stale_reason)s::text
    FROM restarted
    UNION ALL
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           %(failure)s::text || ': ' || %(reason)s::text
    FROM failed)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM failed;

-- Three ways out, by the row as locked: stale → restarted; the snooze past max_snoozes →
-- failed(exhausted) (the words are leaseq.job.snoozed_too_often's); otherwise pending after
-- the delay with the attempt given back. Each snooze is counted.
-- name: snooze
WITH old AS (
    SELECT id, stale, snoozes + 1 > %(max_snoozes)s AS spent FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing'
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
snoozed_out AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = 'exhausted', snoozes = j.snoozes + 1,
        error = 'snoozed ' || (j.snoozes + 1) || ' times without finishing',
        lease_until = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale AND old.spent
    RETURNING j.*),
snoozed AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = greatest(j.attempts - 1, 0), snoozes = j.snoozes + 1,
        lease_until = {now} + make_interval(secs => %(delay_s)s), published_at = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale AND NOT old.spent
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id,
           %(stale_reason)s::text
    FROM restarted
    UNION ALL
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           'exhausted: ' || error
    FROM snoozed_out
    UNION ALL
    SELECT queue, id, {now}, {event.snoozed}, attempts, lease_epoch, worker_id, %(reason)s::text
    FROM snoozed)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM snoozed_out
UNION ALL
SELECT *, false FROM snoozed;

-- Back to pending at once, by the row as locked: stale → restarted; a give-back that is free
-- (the handler never started, or it ran and givebacks < max_givebacks) refunds the attempt
-- (counted when it ran); past the bound the attempt is spent, and on the last attempt the
-- job is failed(exhausted) (the words are leaseq.job.given_back_too_often's).
-- name: give_back
WITH old AS (
    SELECT id, stale, NOT %(started)s OR givebacks < %(max_givebacks)s AS free,
           attempts >= max_attempts AS last FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing'
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
exhausted AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
        error = 'given back ' || j.givebacks || ' times while its handler ran; '
                || 'its attempts are spent'
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale AND NOT old.free
      AND old.last
    RETURNING j.*),
given AS (
    UPDATE {jobs} j
    SET status = 'pending',
        attempts = CASE WHEN old.free THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
        givebacks = j.givebacks + CASE WHEN old.free AND %(started)s THEN 1 ELSE 0 END,
        lease_until = {now}, published_at = NULL, updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND NOT old.stale
      AND (old.free OR NOT old.last)
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id,
           %(stale_reason)s::text
    FROM restarted
    UNION ALL
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           'exhausted: ' || error
    FROM exhausted
    UNION ALL
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id, %(reason)s::text
    FROM given)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM exhausted
UNION ALL
SELECT *, false FROM given;

-- Step 1 of reclaim: spent jobs are buried before step 2 can make them pending.
-- name: expire_spent
WITH spent AS (
    UPDATE {jobs}
    SET status = 'failed', failure = 'expired', lease_until = NULL, updated_at = {now},
        error = 'lease expired on attempt ' || attempts || ' of ' || max_attempts
                || coalesce(' (worker ' || worker_id || ')', '')
    WHERE queue = %(queue)s AND status = 'processing' AND attempts >= max_attempts
      AND lease_until < {now}
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           {reason.expired}
    FROM spent ORDER BY id)
SELECT count(*) AS n FROM spent;

-- name: return_expired
WITH returned AS (
    UPDATE {jobs}
    SET status = 'pending', lease_until = {now}, stale = false, published_at = NULL,
        updated_at = {now}
    WHERE queue = %(queue)s AND status = 'processing' AND attempts < max_attempts
      AND lease_until < {now}
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.reclaimed}, attempts, lease_epoch, worker_id,
           {reason.lease_expired}
    FROM returned ORDER BY id)
SELECT count(*) AS n FROM returned;

-- Step 3 of reclaim: a pending job with its attempts spent can never be claimed (data written
-- before a new revision reset them); quarantine it. The predicate is the partial index's.
-- name: exhaust_pending
WITH stuck AS (
    UPDATE {jobs}
    SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
        error = 'attempts spent while pending (' || attempts || ' of ' || max_attempts || ')'
    WHERE queue = %(queue)s AND status = 'pending' AND attempts >= max_attempts
    RETURNING queue, id, attempts, lease_epoch, worker_id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.quarantined}, attempts, lease_epoch, worker_id,
           {reason.spent_while_pending}
    FROM stuck ORDER BY id)
SELECT count(*) AS n FROM stuck;

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
    SET status = 'cancelled', lease_until = NULL, stale = false, updated_at = {now}
    WHERE queue = %(queue)s AND id = %(id)s AND status IN ('pending', 'processing', 'failed')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, {event.cancelled}, attempts, lease_epoch, {reason.operator}
    FROM changed)
SELECT count(*) AS n FROM changed;

-- name: exists
SELECT 1 AS found FROM {jobs} WHERE queue = %(queue)s AND id = %(id)s;

-- statuses / ages are parallel arrays: one retention rule per status.
-- name: purge
WITH rules AS (
    SELECT * FROM unnest(%(statuses)s::text[], %(ages)s::float8[]) AS r(status, age_s)),
gone AS (
    DELETE FROM {jobs} j USING rules r
    WHERE j.queue = %(queue)s AND j.status = r.status
      AND j.updated_at < {now} - make_interval(secs => r.age_s)
    RETURNING j.id),
log AS (
    DELETE FROM {journal}
    WHERE queue = %(queue)s AND job_id IN (SELECT id FROM gone))
SELECT count(*) AS n FROM gone;

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

-- name: journal
SELECT * FROM {journal} WHERE queue = %(queue)s AND job_id = %(id)s ORDER BY seq;

-- name: append_journal
INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason, data)
VALUES (%(queue)s, %(id)s, {now}, %(event)s, %(attempt)s, %(lease_epoch)s, %(worker_id)s,
        %(reason)s, %(data)s::json);

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

-- --- limits in the claim (docs/limits.md) ---------------------------------------------------
-- A limited claim is one transaction: it locks its queue's limits row first (limit_lock), so
-- every count the claim statement reads next (a new snapshot, READ COMMITTED) stays true until
-- it commits: no other limited claim of the queue runs in between. Finishes take no lock;
-- they only lower the counts.

-- name: limit_row
INSERT INTO {limits} (queue) VALUES (%(queue)s) ON CONFLICT (queue) DO NOTHING;

-- clock_timestamp(), not now(): the stamp of a claim that waited on the lock is the time it
-- got it (limits.stamp keeps stamps from going backwards).
-- name: limit_lock
SELECT recent, key_limit, rate_per_s,
       extract(epoch FROM clock_timestamp())::float8 + %(off)s AS now
FROM {limits} WHERE queue = %(queue)s
FOR UPDATE;

-- The limits a key-limited claim runs with, written only when they changed.
-- name: record_limits
UPDATE {limits}
SET key_limit = %(key_limit)s::integer, rate_per_s = %(rate_per_s)s::integer
WHERE queue = %(queue)s
  AND (key_limit IS DISTINCT FROM %(key_limit)s::integer
       OR rate_per_s IS DISTINCT FROM %(rate_per_s)s::integer);

-- name: save_limits
UPDATE {limits}
SET recent = %(recent)s::float8[], key_limit = %(key_limit)s, rate_per_s = %(rate_per_s)s
WHERE queue = %(queue)s;

-- The key-limited claim, in one statement: a loose index scan of jobs_keyed gives each key
-- with live jobs (one probe per key); per key, its count in jobs_keyed_running (read no
-- further than key_limit) gives its free slots and a walk of jobs_keyed its first ready jobs; jobs without a key come from the front of
-- jobs_claimable (among the first `scan` of them, limits.UNKEYED_SCAN). The best `limit` of
-- those, in claim order, are taken. The predicates repeat the partial indexes'.
-- name: claim_keyed
WITH RECURSIVE keys(k) AS (
    SELECT min(concurrency_key) FROM {jobs}
    WHERE queue = %(queue)s AND concurrency_key IS NOT NULL
      AND status IN ('pending', 'processing')
    UNION ALL
    SELECT (SELECT min(j.concurrency_key) FROM {jobs} j
            WHERE j.queue = %(queue)s AND j.concurrency_key > keys.k
              AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing'))
    FROM keys WHERE keys.k IS NOT NULL),
slots AS (
    SELECT k, %(key_limit)s - (
        SELECT count(*) FROM (
            SELECT 1 FROM {jobs} r
            WHERE r.queue = %(queue)s AND r.concurrency_key = keys.k
              AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
            LIMIT %(key_limit)s) running) AS free
    FROM keys WHERE k IS NOT NULL),
cand AS (
    SELECT c.id, c.priority, c.lease_until
    FROM slots CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.lease_until FROM {jobs} j
        WHERE j.queue = %(queue)s AND j.concurrency_key = slots.k
          AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing')
          AND j.attempts < j.max_attempts
          AND j.lease_until <= (SELECT {now})
          AND (j.status = 'pending' OR j.lease_until < (SELECT {now}))
        ORDER BY j.priority DESC, j.lease_until, j.id
        LIMIT least(slots.free, %(limit)s)) c
    WHERE slots.free > 0
    UNION ALL
    SELECT f.id, f.priority, f.lease_until FROM (
        SELECT id, priority, lease_until, concurrency_key FROM {jobs}
        WHERE queue = %(queue)s
          AND status IN ('pending', 'processing') AND attempts < max_attempts
          AND lease_until <= (SELECT {now})
          AND (status = 'pending' OR lease_until < (SELECT {now}))
        ORDER BY priority DESC, lease_until, id
        LIMIT %(scan)s) f
    WHERE f.concurrency_key IS NULL),
best AS (
    SELECT id FROM cand ORDER BY priority DESC, lease_until, id LIMIT %(limit)s),
c AS (
    SELECT j.id FROM {jobs} j
    WHERE j.queue = %(queue)s AND j.id IN (SELECT id FROM best)
    FOR UPDATE SKIP LOCKED),
taken AS (
    UPDATE {jobs} j
    SET status = 'processing', worker_id = %(worker_id)s, attempts = j.attempts + 1,
        lease_epoch = j.lease_epoch + 1, lease_until = {now} + make_interval(secs => %(lease_s)s),
        stale = false, updated_at = {now}
    FROM c WHERE j.queue = %(queue)s AND j.id = c.id
    RETURNING j.*),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason)
    SELECT queue, id, {now}, {event.claimed}, attempts, lease_epoch, worker_id,
           CASE WHEN lease_epoch > 1 THEN {reason.redelivered} END
    FROM taken ORDER BY id)
SELECT * FROM taken ORDER BY lease_until, id;

-- One job's key and how many of its key are processing (claim_one under a key limit).
-- name: job_key_running
SELECT j.concurrency_key,
       (SELECT count(*) FROM {jobs} r
        WHERE r.queue = %(queue)s AND r.concurrency_key = j.concurrency_key
          AND r.concurrency_key IS NOT NULL AND r.status = 'processing') AS running
FROM {jobs} j WHERE j.queue = %(queue)s AND j.id = %(id)s;

-- name: limits_row
SELECT l.recent, l.key_limit, l.rate_per_s, extract(epoch FROM {now})::float8 AS now
FROM (SELECT 1) one LEFT JOIN {limits} l ON l.queue = %(queue)s;

-- Per key with live jobs: how many are ready and how many are processing (held_back).
-- name: key_backlog
SELECT concurrency_key,
       count(*) FILTER (WHERE status = 'processing') AS running,
       count(*) FILTER (WHERE attempts < max_attempts AND lease_until <= {now}
                        AND (status = 'pending' OR lease_until < {now})) AS ready
FROM {jobs}
WHERE queue = %(queue)s AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
GROUP BY concurrency_key;


-- The schedule ledger (docs/periodic.md). Every write bumps `version`, the compare-and-set
-- token an advance is planned against.

-- name: schedule_insert
INSERT INTO {schedules} (name, queue, spec, cursor, version, created_at, updated_at)
VALUES (%(schedule)s, %(queue)s, %(spec)s, {now}, 0, {now}, {now})
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- Locks the row, so a change is decided once and journaled once.
-- name: schedule_lock
SELECT * FROM {schedules} WHERE name = %(schedule)s FOR UPDATE;

-- name: schedule_respec
UPDATE {schedules}
SET spec = %(spec)s, queue = %(queue)s, active = true, version = version + 1,
    updated_at = {now}
WHERE name = %(schedule)s AND (spec <> %(spec)s OR queue <> %(queue)s OR NOT active)
RETURNING name;

-- name: schedule_get
SELECT * FROM {schedules} WHERE name = %(schedule)s;

-- name: schedule_list
SELECT * FROM {schedules} ORDER BY name;

-- The compare-and-set: no row comes back when another scheduler (or a pause, a resume, a
-- change) moved the version since this advance was planned. A concurrent advance holds the
-- row lock until it commits; this one then re-checks the version and matches nothing.
-- name: schedule_advance
UPDATE {schedules}
SET cursor = %(cursor)s, version = version + 1,
    last_tick = coalesce(%(last_tick)s, last_tick),
    last_job_id = coalesce(%(last_job_id)s, last_job_id),
    skipped = skipped + %(skipped)s, updated_at = {now}
WHERE name = %(schedule)s AND version = %(version)s AND NOT paused AND active
  AND cursor < %(cursor)s
RETURNING queue;

-- A resume moves the cursor to now: the ticks of the pause never fire.
-- name: schedule_pause
UPDATE {schedules}
SET paused = %(paused)s, version = version + 1, updated_at = {now},
    cursor = CASE WHEN %(paused)s THEN cursor ELSE greatest(cursor, {now}) END
WHERE name = %(schedule)s AND paused <> %(paused)s
RETURNING queue;

-- name: schedule_deactivate
UPDATE {schedules}
SET active = false, version = version + 1, updated_at = {now}
WHERE active AND queue = ANY(%(queues)s::text[]) AND NOT name = ANY(%(keep)s::text[])
RETURNING name, queue;

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

-- name: walk_task
SELECT NULL AS k, id,
       ((%(prefix)s::text IS NULL OR left(id, length(%(prefix)s)) = %(prefix)s)
        AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
        AND updated_at >= %(since)s AND updated_at < %(until)s) AS hit
FROM {jobs}
WHERE queue = %(queue)s AND task = %(task)s AND id > %(after_id)s
ORDER BY id
LIMIT %(n)s;

-- name: walk_ids
SELECT NULL AS k, id,
       ((%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
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
    SET status = 'cancelled', lease_until = NULL, stale = false, updated_at = {now}
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
      AND status IN ('pending', 'processing', 'failed')
    RETURNING queue, id, attempts, lease_epoch),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, attempt, lease_epoch, reason)
    SELECT queue, id, {now}, %(event)s, attempts, lease_epoch, %(reason)s
    FROM changed ORDER BY id)
SELECT id FROM changed;

-- name: bulk_delete
WITH changed AS (
    DELETE FROM {jobs}
    WHERE queue = %(queue)s AND id = ANY(%(ids)s::text[])
      AND status NOT IN ('pending', 'processing')
    RETURNING queue, id, attempts, lease_epoch),
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

-- name: journal_hourly
SELECT date_trunc('hour', at, 'UTC') AS hour, event, count(*) AS n
FROM {journal}
WHERE queue = %(queue)s
  AND at >= date_trunc('hour', {now}, 'UTC') - make_interval(hours => %(hours)s - 1)
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: register_worker
INSERT INTO {workers} (worker_id, queues, in_flight, started_at, last_beat_at)
VALUES (%(worker_id)s, %(queues)s::json, %(in_flight)s, {now}, {now})
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, in_flight = excluded.in_flight,
    last_beat_at = excluded.last_beat_at;

-- name: unregister_worker
DELETE FROM {workers} WHERE worker_id = %(worker_id)s;

-- name: list_workers
SELECT * FROM {workers} ORDER BY worker_id LIMIT %(limit)s;

-- name: prune_workers
WITH gone AS (
    DELETE FROM {workers} WHERE last_beat_at < {now} - make_interval(secs => %(older_than_s)s)
    RETURNING 1)
SELECT count(*) AS n FROM gone;

-- Bounded counts for the overview and doctor: at most "cap" index entries each.
-- name: count_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s LIMIT %(cap)s) AS c;

-- The planner's row estimate for one status (run with client-side parameters: EXPLAIN
-- takes no server-side ones), shown instead of a count past the cap.
-- name: estimate_status
EXPLAIN (FORMAT JSON) SELECT 1 FROM {jobs} WHERE queue = %(queue)s AND status = %(status)s;

-- name: ready_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM {jobs}
    WHERE queue = %(queue)s
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    LIMIT %(cap)s) AS c;

-- name: oldest_ready
SELECT extract(epoch FROM {now} - lease_until)::float8 AS age FROM {jobs}
WHERE queue = %(queue)s
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY lease_until
LIMIT 1;

-- Dead rows per table of the store's schema (doctor's bloat check): the statistics views,
-- no scan of the tables themselves.
-- name: table_health
SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS size_bytes,
       greatest(last_vacuum, last_autovacuum) AS last_vacuum
FROM pg_stat_user_tables
WHERE schemaname = %(schema)s
ORDER BY relname;

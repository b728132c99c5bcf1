-- PostgreSQL queries of leaseq: enqueue (placeholders as described in common.sql).

-- The common enqueue in one statement: a batch of new ids is inserted with its journal rows
-- and one NOTIFY (delivered at commit). Nothing is looked up first and the INSERT has no
-- ON CONFLICT (each costs a probe of the primary key per row): an id that exists already (a
-- replay, an update, a conflict, or a concurrent enqueue's insert) raises unique_violation,
-- which aborts the whole statement (no half-written batch; the server logs the error), and
-- the caller decides on the careful path. Reading nothing, the statement has one plan
-- whatever the table holds: leaseq's own connections prepare it once (generic plan, like
-- enqueue_one); a caller's connection= runs it unprepared.
-- The batch comes as JSON arrays read side by side, ids and payloads always, any other column
-- only when its value varies in the batch, else as one value for all (`<name>_all`, see
-- batch_columns in enqueue.py; json_array_elements_text(NULL) gives no rows, so that column
-- reads NULL and coalesce takes the shared value). Payloads come as one JSON array of the
-- payloads' own texts: json_array_elements gives each element's text exactly as sent, already
-- checked by the parse of the array, so the stored json is the canonical text unchanged and is
-- parsed once, not twice. The store clock is read once (`t`), not per row and column.
-- The journal rows are not sorted: each job has one in the batch, and the order of one job's
-- rows (seq) is all the journal keeps. The last SELECT reads `note` so that the NOTIFY is
-- evaluated.
-- name: enqueue_fast
WITH t AS (
    SELECT {now} AS now),
u AS (
    SELECT * FROM ROWS FROM (json_array_elements_text(%(ids)s::json),
                             json_array_elements(%(payloads)s::json),
                             json_array_elements_text(%(task_each)s::json),
                             json_array_elements_text(%(revision_each)s::json),
                             json_array_elements_text(%(delay_s_each)s::json),
                             json_array_elements_text(%(max_attempts_each)s::json),
                             json_array_elements_text(%(data_each)s::json),
                             json_array_elements_text(%(priority_each)s::json),
                             json_array_elements_text(%(key_each)s::json))
        AS u(id, payload, task, revision, delay_s, max_attempts, data, priority,
             concurrency_key)),
ins AS (
    INSERT INTO {jobs} (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                        lease_epoch, revision, created_at, updated_at, first_seen_at,
                        priority, concurrency_key)
    SELECT %(queue)s, id, coalesce(task, %(task_all)s::text), 'pending', payload, 0,
           coalesce(max_attempts::integer, %(max_attempts_all)s::integer),
           t.now + make_interval(secs => coalesce(delay_s::float8, %(delay_s_all)s::float8)), 0,
           coalesce(revision, %(revision_all)s::text), t.now, t.now, t.now,
           coalesce(priority::integer, %(priority_all)s::integer),
           coalesce(concurrency_key, %(key_all)s::text)
    FROM u, t ORDER BY id),
log AS (
    INSERT INTO {journal} (queue, job_id, at, event, reason, data)
    SELECT %(queue)s, id, t.now, {event.enqueued}, {created},
           coalesce(data, %(data_all)s::text)::json
    FROM u, t
    WHERE coalesce(data, %(data_all)s::text) IS NOT NULL),
note AS (
    SELECT pg_notify(%(channel)s, %(queue)s))
SELECT 1 AS sent FROM note;

-- enqueue_fast for one new job, with scalar parameters, prepared. The row exists already
-- (a replay, an update, a conflict, or a concurrent enqueue's insert): DO NOTHING on the
-- primary key writes nothing, and the caller takes the careful path. A row comes back when the
-- job and its NOTIFY were written. No lookup to plan: the arbiter index is the primary key by
-- definition, so it runs on the session's second pool, where a prepared statement keeps its
-- generic plan (planning this one on every run cost as much as running it). Only on leaseq's
-- own connections: a caller's connection= takes enqueue_fast. A job without a revision writes
-- no journal row (see journal in read.sql), so this is one INSERT, no CTE: the three CTEs the
-- journaled form needs cost about 20 µs of a ~290 µs statement.
-- name: enqueue_one
INSERT INTO {jobs} (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                    lease_epoch, revision, created_at, updated_at, first_seen_at,
                    priority, concurrency_key)
VALUES (%(queue)s, %(id)s, %(task)s, 'pending', %(payload)s::json, 0, %(max_attempts)s,
        {now} + make_interval(secs => %(delay_s)s), 0, NULL, {now}, {now}, {now},
        %(priority)s, %(concurrency_key)s)
ON CONFLICT (queue, id) DO NOTHING
RETURNING pg_notify(%(channel)s, %(queue)s);

-- enqueue_one for a job with a revision, whose creation row carries it. `inserted` is 1 when
-- the job, its journal row and its NOTIFY were written.
-- name: enqueue_one_journaled
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
    SELECT %(queue)s, id, {now}, {event.enqueued}, {created}, %(data)s::json FROM ins),
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
-- It keeps its concurrency key while it runs (the key's running count must not move); the
-- new revision's key waits in next_concurrency_key until the job goes back to pending.
-- name: mark_stale
UPDATE {jobs}
SET payload = %(payload)s::json, task = %(task)s, revision = %(revision)s,
    max_attempts = %(max_attempts)s, attempts = 0, snoozes = 0, givebacks = 0, stale = true,
    updated_at = {now}, priority = %(priority)s, next_concurrency_key = %(concurrency_key)s
WHERE queue = %(queue)s AND id = %(id)s;

-- name: journal_enqueued
INSERT INTO {journal} (queue, job_id, at, event, reason, data)
SELECT %(queue)s, u.id, {now}, {event.enqueued}, u.reason, u.data::json
FROM unnest(%(ids)s::text[], %(reasons)s::text[], %(data)s::text[]) WITH ORDINALITY
     AS u(id, reason, data, n)
ORDER BY u.n;

-- name: notify
SELECT pg_notify(%(channel)s, %(queue)s);

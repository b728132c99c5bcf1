-- SQLite queries of leaseq. {now} is SQLite's own clock in Unix seconds plus the test-only
-- offset :off; it is the same value for every use inside one statement.

-- name: now
SELECT {now} AS now;

-- name: find_existing
SELECT id, status, payload, revision FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- name: insert_job
INSERT INTO leaseq_jobs (queue, id, task, status, payload, attempts, max_attempts, lease_until,
                         lease_epoch, revision, created_at, updated_at, first_seen_at,
                         priority, concurrency_key)
VALUES (:queue, :id, :task, 'pending', :payload, 0, :max_attempts, {now} + :delay_s,
        0, :revision, {now}, {now}, {now}, :priority, :concurrency_key);

-- name: revive_job
UPDATE leaseq_jobs
SET status = 'pending', payload = :payload, task = :task, revision = :revision,
    max_attempts = :max_attempts, attempts = 0, snoozes = 0, givebacks = 0, failure = NULL,
    result = NULL,
    result_key = NULL, stale = 0, worker_id = NULL, lease_until = {now} + :delay_s,
    published_at = NULL, updated_at = {now}, priority = :priority,
    concurrency_key = :concurrency_key
WHERE queue = :queue AND id = :id;

-- A new revision starts with a fresh budget: attempts kept from the old one could be at or
-- past the new max_attempts, and nothing would ever claim the job again.
-- name: update_pending
UPDATE leaseq_jobs
SET payload = :payload, task = :task, revision = :revision, max_attempts = :max_attempts,
    attempts = 0, snoozes = 0, givebacks = 0,
    lease_until = {now} + :delay_s, published_at = NULL, updated_at = {now},
    priority = :priority, concurrency_key = :concurrency_key
WHERE queue = :queue AND id = :id;

-- A processing job keeps its lease; its worker's finish becomes a give-back (see base.py).
-- The running attempt belongs to the old revision, so the budget is reset now: an expired
-- lease then returns the job ready for the new revision instead of failing it as expired.
-- It keeps its concurrency key while it runs: the key's running count must not move.
-- name: mark_stale
UPDATE leaseq_jobs
SET payload = :payload, task = :task, revision = :revision, max_attempts = :max_attempts,
    attempts = 0, snoozes = 0, givebacks = 0, stale = 1, updated_at = {now},
    priority = :priority
WHERE queue = :queue AND id = :id;

-- The inner SELECT repeats the partial index's predicate word for word so SQLite uses it.
-- name: claim
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now}
WHERE queue = :queue AND id IN (
    SELECT id FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    ORDER BY priority DESC, lease_until, id
    LIMIT :limit)
RETURNING *;

-- name: claim_one
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now}
WHERE queue = :queue AND id = :id
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND (lease_until IS NULL OR (lease_until <= {now} AND (status = 'pending' OR lease_until < {now})))
RETURNING *;

-- :leases is a JSON array of [id, lease_epoch] pairs.
-- name: heartbeat
UPDATE leaseq_jobs
SET lease_until = {now} + :lease_s
WHERE queue = :queue AND status = 'processing'
  AND (id, lease_epoch) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:leases))
RETURNING id;

-- name: journal_heartbeat_lost
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, reason)
SELECT queue, id, {now}, {event.heartbeat_lost}, attempts, :lease_epoch,
       'lease epoch ' || :lease_epoch || ' lost; job is ' || status || ' at epoch ' || lease_epoch
FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- name: fenced_row
SELECT stale, attempts, max_attempts, snoozes, givebacks FROM leaseq_jobs
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing';

-- name: complete
UPDATE leaseq_jobs
SET status = :status, result = :result, result_key = :result_key, failure = NULL,
    lease_until = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- :items is a JSON array of [id, lease_epoch, status, result_json, result_key]. Stale jobs
-- are left out here (they become give-backs one by one).
-- name: complete_many
WITH i AS MATERIALIZED (  -- materialized so the plan drives from the items into the primary key
    SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS lease_epoch,
           json_extract(value, '$[2]') AS status, json_extract(value, '$[3]') AS result,
           json_extract(value, '$[4]') AS result_key
    FROM json_each(:items))
UPDATE leaseq_jobs
SET status = i.status, result = i.result, result_key = i.result_key, failure = NULL,
    lease_until = NULL, updated_at = {now}
FROM i
WHERE leaseq_jobs.queue = :queue AND leaseq_jobs.id = i.id
  AND leaseq_jobs.lease_epoch = i.lease_epoch AND leaseq_jobs.status = 'processing'
  AND leaseq_jobs.stale = 0
RETURNING *;

-- name: retry_later
UPDATE leaseq_jobs
SET status = 'pending', error = :error, lease_until = {now} + :delay_s, published_at = NULL,
    updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- name: fail
UPDATE leaseq_jobs
SET status = 'failed', failure = :failure, error = :error, lease_until = NULL,
    updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- name: snooze
UPDATE leaseq_jobs
SET status = 'pending', attempts = max(attempts - 1, 0), snoozes = snoozes + 1,
    lease_until = {now} + :delay_s, stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- name: snoozed_out
UPDATE leaseq_jobs
SET status = 'failed', failure = 'exhausted', error = :error, snoozes = snoozes + 1,
    lease_until = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- Ready at once. :refund is 1 when the attempt is given back, :counted 1 when the give-back
-- counts toward max_givebacks.
-- name: give_back
UPDATE leaseq_jobs
SET status = 'pending', attempts = max(attempts - :refund, 0), givebacks = givebacks + :counted,
    lease_until = {now}, stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- A stale job's finish: the new revision starts fresh, ready at once.
-- name: restart_revision
UPDATE leaseq_jobs
SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
    stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND lease_epoch = :lease_epoch AND status = 'processing'
RETURNING *;

-- Step 1 of reclaim: spent jobs are buried before step 2 can make them pending.
-- name: expire_spent
UPDATE leaseq_jobs
SET status = 'failed', failure = 'expired', lease_until = NULL, updated_at = {now},
    error = 'lease expired on attempt ' || attempts || ' of ' || max_attempts
            || coalesce(' (worker ' || worker_id || ')', '')
WHERE queue = :queue AND status = 'processing' AND attempts >= max_attempts
  AND lease_until < {now}
RETURNING id, attempts, lease_epoch, worker_id;

-- name: return_expired
UPDATE leaseq_jobs
SET status = 'pending', lease_until = {now}, stale = 0, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND status = 'processing' AND attempts < max_attempts
  AND lease_until < {now}
RETURNING id, attempts, lease_epoch, worker_id;

-- Step 3 of reclaim: a pending job with its attempts spent can never be claimed (data written
-- before a new revision reset them); quarantine it. The predicate is the partial index's.
-- name: exhaust_pending
UPDATE leaseq_jobs
SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
    error = 'attempts spent while pending (' || attempts || ' of ' || max_attempts || ')'
WHERE queue = :queue AND status = 'pending' AND attempts >= max_attempts
RETURNING id, attempts, lease_epoch, worker_id;

-- name: operator_requeue
UPDATE leaseq_jobs
SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, failure = NULL, stale = 0,
    worker_id = NULL,
    lease_until = {now}, published_at = NULL, updated_at = {now}
WHERE queue = :queue AND id = :id AND status NOT IN ('pending', 'processing')
RETURNING attempts, lease_epoch;

-- name: operator_cancel
UPDATE leaseq_jobs
SET status = 'cancelled', lease_until = NULL, stale = 0, updated_at = {now}
WHERE queue = :queue AND id = :id AND status IN ('pending', 'processing', 'failed')
RETURNING attempts, lease_epoch;

-- name: exists
SELECT 1 FROM leaseq_jobs WHERE queue = :queue AND id = :id;

-- name: purge_journal
DELETE FROM leaseq_journal
WHERE queue = :queue AND job_id IN (
    SELECT id FROM leaseq_jobs
    WHERE queue = :queue AND status = :status AND updated_at < {now} - :older_than_s);

-- name: purge_jobs
DELETE FROM leaseq_jobs
WHERE queue = :queue AND status = :status AND updated_at < {now} - :older_than_s;

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

-- name: any_ready
SELECT 1 AS ready FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
LIMIT 1;

-- A loose index scan: one index seek per queue, from each queue name to the next, instead of
-- reading every job (SELECT DISTINCT walks the whole index). The sweeper and the metrics ask.
-- name: queues
WITH RECURSIVE q(queue) AS (
    SELECT min(queue) FROM leaseq_jobs
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq_jobs j WHERE j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL)
SELECT queue FROM q WHERE queue IS NOT NULL;

-- name: journal
SELECT * FROM leaseq_journal WHERE queue = :queue AND job_id = :id ORDER BY seq;

-- name: append_journal
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt, lease_epoch, worker_id, reason, data)
VALUES (:queue, :id, {now}, :event, :attempt, :lease_epoch, :worker_id, :reason, :data);

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
-- later pending state has no message behind it). :leases is a JSON array of [id, epoch].
UPDATE leaseq_jobs SET published_at = {now}
WHERE queue = :queue AND status = 'pending' AND published_at IS NULL AND lease_until <= {now}
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

-- --- limits in the claim (docs/limits.md) ---------------------------------------------------
-- Every query below runs under BEGIN IMMEDIATE, which serialises the claims of every queue.

-- Each key with live jobs and how many of them are processing: a loose index scan
-- of leaseq_jobs_keyed, one seek per key, and a count in leaseq_jobs_keyed_running that
-- stops at :key_limit (the key is full then, however many run). The
-- predicates repeat the indexes'; without statistics the planner would count a key's jobs by
-- walking the queue's primary key, so the count names its index.
-- name: key_slots
WITH RECURSIVE keys(k) AS (
    SELECT min(concurrency_key) FROM leaseq_jobs
    WHERE queue = :queue AND concurrency_key IS NOT NULL
      AND status IN ('pending', 'processing')
    UNION ALL
    SELECT (SELECT min(j.concurrency_key) FROM leaseq_jobs j
            WHERE j.queue = :queue AND j.concurrency_key > keys.k
              AND j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'processing'))
    FROM keys WHERE keys.k IS NOT NULL)
SELECT k AS concurrency_key,
       (SELECT count(*) FROM (
            SELECT 1 FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
            WHERE r.queue = :queue AND r.concurrency_key = keys.k
              AND r.concurrency_key IS NOT NULL AND r.status = 'processing'
            LIMIT :key_limit)) AS running
FROM keys WHERE k IS NOT NULL;

-- The first ready jobs of one key, in claim order.
-- name: key_candidates
SELECT id, priority, lease_until FROM leaseq_jobs
WHERE queue = :queue AND concurrency_key = :concurrency_key
  AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
  AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY priority DESC, lease_until, id
LIMIT :limit;

-- Ready jobs without a key, among the first :scan claimable jobs (limits.UNKEYED_SCAN).
-- name: unkeyed_candidates
SELECT id, priority, lease_until FROM (
    SELECT id, priority, lease_until, concurrency_key FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    ORDER BY priority DESC, lease_until, id
    LIMIT :scan)
WHERE concurrency_key IS NULL
LIMIT :limit;

-- The chosen candidates, each still claimable. :ids is a JSON array.
-- name: claim_chosen
UPDATE leaseq_jobs
SET status = 'processing', worker_id = :worker_id, attempts = attempts + 1,
    lease_epoch = lease_epoch + 1, lease_until = {now} + :lease_s, stale = 0,
    updated_at = {now}
WHERE queue = :queue AND id IN (SELECT value FROM json_each(:ids))
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
RETURNING *;

-- name: limits_row
SELECT recent, key_limit, rate_per_s, {now} AS now FROM leaseq_limits WHERE queue = :queue;

-- name: save_limits
INSERT INTO leaseq_limits (queue, recent, key_limit, rate_per_s)
VALUES (:queue, :recent, :key_limit, :rate_per_s)
ON CONFLICT (queue) DO UPDATE
SET recent = excluded.recent, key_limit = excluded.key_limit, rate_per_s = excluded.rate_per_s;

-- Per key with ready jobs: how many are ready and how many run (for held_back).
-- name: key_backlog
SELECT concurrency_key,
       sum(status = 'processing') AS running,
       sum(attempts < max_attempts AND lease_until <= {now}
           AND (status = 'pending' OR lease_until < {now})) AS ready
FROM leaseq_jobs
WHERE queue = :queue AND concurrency_key IS NOT NULL AND status IN ('pending', 'processing')
GROUP BY concurrency_key;

-- One job's key and how many of its key are processing (claim_one under a key limit).
-- name: job_key_running
SELECT j.concurrency_key,
       (SELECT count(*) FROM leaseq_jobs r INDEXED BY leaseq_jobs_keyed_running
        WHERE r.queue = :queue AND r.concurrency_key = j.concurrency_key
          AND r.concurrency_key IS NOT NULL AND r.status = 'processing') AS running
FROM leaseq_jobs j WHERE j.queue = :queue AND j.id = :id;


-- The schedule ledger (docs/periodic.md). Every write bumps `version`, the compare-and-set
-- token an advance is planned against.

-- name: schedule_insert
INSERT INTO leaseq_schedules (name, queue, spec, cursor, version, created_at, updated_at)
VALUES (:schedule, :queue, :spec, {now}, 0, {now}, {now})
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: schedule_respec
UPDATE leaseq_schedules
SET spec = :spec, queue = :queue, active = 1, version = version + 1, updated_at = {now}
WHERE name = :schedule AND (spec <> :spec OR queue <> :queue OR active = 0)
RETURNING name;

-- name: schedule_get
SELECT * FROM leaseq_schedules WHERE name = :schedule;

-- name: schedule_list
SELECT * FROM leaseq_schedules ORDER BY name;

-- The compare-and-set: no row comes back when another scheduler (or a pause, a resume, a
-- change) moved the version since this advance was planned.
-- name: schedule_advance
UPDATE leaseq_schedules
SET cursor = :cursor, version = version + 1,
    last_tick = coalesce(:last_tick, last_tick), last_job_id = coalesce(:last_job_id, last_job_id),
    skipped = skipped + :skipped, updated_at = {now}
WHERE name = :schedule AND version = :version AND paused = 0 AND active = 1 AND cursor < :cursor
RETURNING queue;

-- A resume moves the cursor to now: the ticks of the pause never fire.
-- name: schedule_pause
UPDATE leaseq_schedules
SET paused = :paused, version = version + 1, updated_at = {now},
    cursor = CASE WHEN :paused = 0 THEN max(cursor, {now}) ELSE cursor END
WHERE name = :schedule AND paused <> :paused
RETURNING queue;

-- name: schedule_deactivate
UPDATE leaseq_schedules
SET active = 0, version = version + 1, updated_at = {now}
WHERE active = 1
  AND queue IN (SELECT value FROM json_each(:queues))
  AND name NOT IN (SELECT value FROM json_each(:keep))
RETURNING name, queue;

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
SET status = 'cancelled', lease_until = NULL, stale = 0, updated_at = {now}
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

-- Hours are whole multiples of 3,600 s since the epoch (UTC).
-- name: journal_hourly
SELECT CAST(at / 3600 AS INTEGER) * 3600 AS hour, event, count(*) AS n
FROM leaseq_journal
WHERE queue = :queue AND at >= (CAST({now} / 3600 AS INTEGER) - :hours + 1) * 3600
GROUP BY hour, event
ORDER BY hour, event;

-- name: register_worker
INSERT INTO leaseq_workers (worker_id, queues, in_flight, started_at, last_beat_at)
VALUES (:worker_id, :queues, :in_flight, {now}, {now})
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, in_flight = excluded.in_flight,
    last_beat_at = excluded.last_beat_at;

-- name: unregister_worker
DELETE FROM leaseq_workers WHERE worker_id = :worker_id;

-- name: list_workers
SELECT * FROM leaseq_workers ORDER BY worker_id LIMIT :limit;

-- name: prune_workers
DELETE FROM leaseq_workers WHERE last_beat_at < {now} - :older_than_s RETURNING worker_id;

-- Bounded counts for the overview and doctor: at most :cap index entries each.
-- name: count_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM leaseq_jobs WHERE queue = :queue AND status = :status LIMIT :cap);

-- name: ready_capped
SELECT count(*) AS n FROM (
    SELECT 1 FROM leaseq_jobs
    WHERE queue = :queue
      AND status IN ('pending', 'processing') AND attempts < max_attempts
      AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
    LIMIT :cap);

-- The first claimable job in not-before order is the one ready longest.
-- name: oldest_ready
SELECT {now} - lease_until AS age FROM leaseq_jobs
WHERE queue = :queue
  AND status IN ('pending', 'processing') AND attempts < max_attempts
  AND lease_until <= {now} AND (status = 'pending' OR lease_until < {now})
ORDER BY lease_until
LIMIT 1;

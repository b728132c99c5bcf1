-- PostgreSQL queries of leaseq: schedules (placeholders as described in common.sql).

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

-- A reactivation after more than revive_grace_s inactive (leaseq.ledger.REVIVE_GRACE_S)
-- moves the cursor to now, as a resume does: the ticks of the time the schedule was not in
-- the code never fire. Sooner (a rolling deploy's old scheduler retired it), it keeps it. An active record of a queue the registrar does
-- not use (queues) is another app's and is left alone.
-- name: schedule_respec
UPDATE {schedules}
SET spec = %(spec)s, queue = %(queue)s, active = true, version = version + 1,
    updated_at = {now},
    cursor = CASE WHEN NOT active
                       AND updated_at < {now} - make_interval(secs => %(revive_grace_s)s)
                  THEN greatest(cursor, {now}) ELSE cursor END
WHERE name = %(schedule)s AND (spec <> %(spec)s OR queue <> %(queue)s OR NOT active)
  AND (NOT active OR queue = %(queue)s OR queue = ANY(%(queues)s::text[]))
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

-- A manual tick: its job is the last one (overlap="skip" waits for it); the cursor stays.
-- An inactive record's updated_at is the moment it was retired, which schedule_respec's
-- grace reads: an operator's trigger, pause or resume keeps it, so re-adding a schedule
-- retired more than an hour ago fires none of the gap whatever was done to it meanwhile.
-- name: schedule_trigger
UPDATE {schedules}
SET last_job_id = %(job_id)s, version = version + 1,
    updated_at = CASE WHEN active THEN {now} ELSE updated_at END
WHERE name = %(schedule)s AND queue = %(queue)s
RETURNING queue;

-- A resume moves the cursor to now: the ticks of the pause never fire. An inactive record
-- keeps its updated_at, as in schedule_trigger.
-- name: schedule_pause
UPDATE {schedules}
SET paused = %(paused)s, version = version + 1,
    updated_at = CASE WHEN active THEN {now} ELSE updated_at END,
    cursor = CASE WHEN %(paused)s THEN cursor ELSE greatest(cursor, {now}) END
WHERE name = %(schedule)s AND paused <> %(paused)s
RETURNING queue;

-- name: schedule_deactivate
UPDATE {schedules}
SET active = false, version = version + 1, updated_at = {now}
WHERE active AND queue = ANY(%(queues)s::text[]) AND NOT name = ANY(%(keep)s::text[])
RETURNING name, queue;

-- SQLite queries of leaseq: schedules (placeholders as described in common.sql).

-- The schedule ledger (docs/periodic.md). Every write bumps `version`, the compare-and-set
-- token an advance is planned against.

-- name: schedule_insert
INSERT INTO leaseq_schedules (name, queue, spec, cursor, version, created_at, updated_at)
VALUES (:schedule, :queue, :spec, {now}, 0, {now}, {now})
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- A reactivation after more than :revive_grace_s inactive (leaseq.ledger.REVIVE_GRACE_S)
-- moves the cursor to now, as a resume does: the ticks of the time the schedule was not in
-- the code never fire. Sooner (a rolling deploy's old scheduler retired it), it keeps it. An active record of a queue the registrar does
-- not use (:queues) is another app's and is left alone.
-- name: schedule_respec
UPDATE leaseq_schedules
SET spec = :spec, queue = :queue, active = 1, version = version + 1, updated_at = {now},
    cursor = CASE WHEN active = 0 AND updated_at < {now} - :revive_grace_s
                  THEN max(cursor, {now}) ELSE cursor END
WHERE name = :schedule AND (spec <> :spec OR queue <> :queue OR active = 0)
  AND (active = 0 OR queue = :queue OR queue IN (SELECT value FROM json_each(:queues)))
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

-- A manual tick: its job is the last one (overlap="skip" waits for it); the cursor stays.
-- An inactive record's updated_at is the moment it was retired, which schedule_respec's
-- grace reads: an operator's trigger, pause or resume keeps it, so re-adding a schedule
-- retired more than an hour ago fires none of the gap whatever was done to it meanwhile.
-- name: schedule_trigger
UPDATE leaseq_schedules
SET last_job_id = :job_id, version = version + 1,
    updated_at = CASE WHEN active = 1 THEN {now} ELSE updated_at END
WHERE name = :schedule AND queue = :queue
RETURNING queue;

-- A resume moves the cursor to now: the ticks of the pause never fire. An inactive record
-- keeps its updated_at, as in schedule_trigger.
-- name: schedule_pause
UPDATE leaseq_schedules
SET paused = :paused, version = version + 1,
    updated_at = CASE WHEN active = 1 THEN {now} ELSE updated_at END,
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

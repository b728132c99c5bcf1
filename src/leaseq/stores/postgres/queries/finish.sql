-- PostgreSQL queries of leaseq: finish (placeholders as described in common.sql).

-- Completions, one or a batch (`complete` sends one item): each item fenced on its own by
-- id + lease_epoch + holder (the claim's worker) + the claim's token (either NULL:
-- unchecked; leaseq.job.Lease) + status processing; a
-- stale one is given back for its new revision. Rows are locked in id order so two batches
-- never wait on each other in a cycle.
-- name: complete_many
WITH items AS (
    SELECT * FROM unnest(%(ids)s::text[], %(epochs)s::bigint[], %(holders)s::text[],
                         %(tokens)s::uuid[], %(statuses)s::text[], %(results)s::text[],
                         %(result_keys)s::text[])
        AS i(id, lease_epoch, worker_id, claim_token, status, result, result_key)),
old AS (
    SELECT j.id, j.stale, i.status, i.result, i.result_key
    FROM {jobs} j JOIN items i ON j.id = i.id AND j.lease_epoch = i.lease_epoch
    WHERE j.queue = %(queue)s AND j.status = 'processing'
      AND (i.worker_id IS NULL OR j.worker_id = i.worker_id)
      AND (i.claim_token IS NULL OR j.claim_token = i.claim_token)
    ORDER BY j.id
    FOR UPDATE OF j),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, concurrency_key = j.next_concurrency_key, published_at = NULL,
        updated_at = {now}
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
      AND status = 'processing' AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s)
      AND (%(claim_token)s::uuid IS NULL OR claim_token = %(claim_token)s::uuid)
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, concurrency_key = j.next_concurrency_key, published_at = NULL,
        updated_at = {now}
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
           %(quarantined)s::text, NULL::json
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
      AND status = 'processing' AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s)
      AND (%(claim_token)s::uuid IS NULL OR claim_token = %(claim_token)s::uuid)
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, concurrency_key = j.next_concurrency_key, published_at = NULL,
        updated_at = {now}
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
           %(quarantined)s::text
    FROM failed)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM failed;

-- Three ways out, by the row as locked: stale → restarted; the snooze past max_snoozes →
-- failed(exhausted) (the words are leaseq.journal.SNOOZED_OUT); otherwise pending after
-- the delay with the attempt given back. Each snooze is counted.
-- name: snooze
WITH old AS (
    SELECT id, stale, snoozes + 1 > %(max_snoozes)s AS spent FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing' AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s)
      AND (%(claim_token)s::uuid IS NULL OR claim_token = %(claim_token)s::uuid)
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, concurrency_key = j.next_concurrency_key, published_at = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
snoozed_out AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = 'exhausted', snoozes = j.snoozes + 1,
        error = replace(%(snoozed_out)s::text, '{n}', (j.snoozes + 1)::text),
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
           %(exhausted_prefix)s::text || error
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
-- job is failed(exhausted) (the words are leaseq.journal.GIVEN_BACK_OUT).
-- name: give_back
WITH old AS (
    SELECT id, stale, NOT %(started)s OR givebacks < %(max_givebacks)s AS free,
           attempts >= max_attempts AS last FROM {jobs}
    WHERE queue = %(queue)s AND id = %(id)s AND lease_epoch = %(lease_epoch)s
      AND status = 'processing' AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s)
      AND (%(claim_token)s::uuid IS NULL OR claim_token = %(claim_token)s::uuid)
    FOR UPDATE),
restarted AS (
    UPDATE {jobs} j
    SET status = 'pending', attempts = 0, snoozes = 0, givebacks = 0, lease_until = {now},
        stale = false, concurrency_key = j.next_concurrency_key, published_at = NULL,
        updated_at = {now}
    FROM old WHERE j.queue = %(queue)s AND j.id = old.id AND old.stale
    RETURNING j.*),
exhausted AS (
    UPDATE {jobs} j
    SET status = 'failed', failure = 'exhausted', lease_until = NULL, updated_at = {now},
        error = replace(%(given_back_out)s::text, '{n}', j.givebacks::text)
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
           %(exhausted_prefix)s::text || error
    FROM exhausted
    UNION ALL
    SELECT queue, id, {now}, {event.given_back}, attempts, lease_epoch, worker_id, %(reason)s::text
    FROM given)
SELECT *, true AS was_stale FROM restarted
UNION ALL
SELECT *, false FROM exhausted
UNION ALL
SELECT *, false FROM given;

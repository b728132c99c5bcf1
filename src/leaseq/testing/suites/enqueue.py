"""Enqueue: idempotent upserts and their outcomes, conflicts, replay, and refused input."""

from __future__ import annotations

from typing import Any

import pytest

from leaseq.errors import InvalidInput, InvalidPolicy, InvalidQueueName, JobConflict
from leaseq.queue import Queue
from leaseq.testing.harness import (
    CLOCK_SLACK_S,
    W1,
    FreshStore,
    advance,
    given_claimed,
    must_get,
    within_readings,
)

#: Payloads every store must give back exactly as given.
ROUND_TRIP = {
    "text": "héllo ✓ 😀 \u200b",
    "int": 2**53,
    "neg": -7,
    "float": 1.5,
    "bool": True,
    "none": None,
    "list": [1, "x", {"k": []}],
    "nested": {"deeper": {"deepest": {}}},
}


def _nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    return root


#: One bad job in a batch with a good one; each must be refused before anything is written.
BAD_JOBS: dict[str, dict[str, Any]] = {
    "nan": {"job_id": "bad", "payload": {"x": float("nan")}},
    "infinity": {"job_id": "bad", "payload": {"x": [float("inf")]}},
    "lone-surrogate": {"job_id": "bad", "payload": {"x": "\ud800"}},
    "deep-nesting": {"job_id": "bad", "payload": _nested(10_000)},
    "reserved-key": {"job_id": "bad", "payload": {"status": "done"}},
    "dollar-key": {"job_id": "bad", "payload": {"a": {"$set": 1}}},
    "empty-id": {"job_id": "", "payload": {}},
    "long-id": {"job_id": "x" * 513, "payload": {}},
    "negative-delay": {"job_id": "bad", "payload": {}, "delay_s": -1},
    "not-an-object": {"job_id": "bad", "payload": [1, 2]},
    "unknown-field": {"job_id": "bad", "payload": {}, "urgency": 1},
    "priority-not-a-number": {"job_id": "bad", "payload": {}, "priority": "high"},
    "priority-out-of-range": {"job_id": "bad", "payload": {}, "priority": 2**31},
    "empty-concurrency-key": {"job_id": "bad", "payload": {}, "concurrency_key": ""},
    "payload-names-priority": {"job_id": "bad", "payload": {"priority": 1}},
}


def _journal_sizes(q: Queue, ids: list[str]) -> list[int]:
    return [len(q.journal(job_id)) for job_id in ids]


class EnqueueSuite:
    def test_created_job_is_pending_and_round_trips(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        before = leaseq_store.store.server_now()
        result = q.enqueue("j1", ROUND_TRIP, task="resize", revision="r1", max_attempts=7)
        after = leaseq_store.store.server_now()
        assert (result.job_id, result.outcome) == ("j1", "created")
        job = must_get(q, "j1")
        assert (job.status, job.payload, job.task, job.revision) == (
            "pending", ROUND_TRIP, "resize", "r1")
        assert (job.attempts, job.max_attempts, job.lease_epoch, job.worker_id) == (0, 7, 0, None)
        assert job.published_at is None and job.created_at is not None
        assert within_readings(0, 0, shortest=(job.created_at - after).total_seconds(),
                               longest=(job.created_at - before).total_seconds())
        assert q.journal("j1")[0].event == "enqueued"

    def test_same_payload_or_same_revision_is_unchanged(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("plain", {"a": 1, "b": 2})
        q.enqueue("versioned", {"a": 1}, revision="r1")
        stored = [must_get(q, "plain"), must_get(q, "versioned")]
        advance(leaseq_store.store, 5)
        # Key order is not a different payload.
        assert q.enqueue("plain", {"b": 2, "a": 1}).outcome == "unchanged"
        assert q.enqueue("versioned", {"a": 2}, revision="r1").outcome == "unchanged"
        assert [must_get(q, "plain"), must_get(q, "versioned")] == stored

    def test_new_revision_updates_a_pending_job(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {"v": 1}, revision="r1")
        assert q.enqueue("j1", {"v": 2}, revision="r2", delay_s=60).outcome == "updated"
        job = must_get(q, "j1")
        assert (job.status, job.payload, job.revision, job.attempts) == (
            "pending", {"v": 2}, "r2", 0)
        assert q.claim(W1) == []  # the new delay applies

    def test_new_revision_of_a_pending_job_starts_a_fresh_budget(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job with three transient failures behind it: attempts 3 of 5
        q = leaseq_store.queue(max_attempts=5)
        q.enqueue("j1", {"v": 1}, revision="r1")
        for _ in range(3):
            q.retry_later(q.claim(W1)[0], "transient", delay_s=0)
        assert must_get(q, "j1").attempts == 3
        # When a new revision comes through a queue whose policy now says max_attempts=2
        stricter = leaseq_store.queue(max_attempts=2)
        assert stricter.enqueue("j1", {"v": 2}, revision="r2").outcome == "updated"
        # Then the new revision has its own budget and runs (it is not stuck pending for ever)
        job = must_get(q, "j1")
        assert (job.status, job.attempts, job.max_attempts) == ("pending", 0, 2)
        assert q.ready() == 1
        (again,) = q.claim(W1)
        assert (again.payload, again.attempts) == ({"v": 2}, 1)

    def test_new_revision_resets_snoozes_and_givebacks(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {"v": 1}, revision="r1")
        q.snooze(q.claim(W1)[0], 0)
        q.give_back(q.claim(W1)[0], started=True)
        assert (must_get(q, "j1").snoozes, must_get(q, "j1").givebacks) == (1, 1)
        q.enqueue("j1", {"v": 2}, revision="r2")
        job = must_get(q, "j1")
        assert (job.attempts, job.snoozes, job.givebacks) == (0, 0, 0)

    @pytest.mark.parametrize("end", ["done", "failed"])
    def test_new_revision_revives_a_terminal_job(self, leaseq_store: FreshStore, end: str) -> None:
        # Given a finished job with a result, or a quarantined one
        q = leaseq_store.queue()
        job = given_claimed(q, revision="r1")
        if end == "done":
            q.complete(job, {"out": 1}, result_key="k1")
        else:
            q.fail(job, "bad")
        # When a new revision arrives, to run in 30 s
        assert q.enqueue(job.id, {"v": 2}, revision="r2", delay_s=30).outcome == "revived"
        # Then it is pending from scratch and ready
        back = must_get(q, job.id)
        assert (back.status, back.attempts, back.failure, back.result, back.result_key) == (
            "pending", 0, None, None, None)
        assert q.claim(W1) == []
        advance(leaseq_store.store, 31)
        assert [j.payload for j in q.claim(W1)] == [{"v": 2}]

    def test_conflict_raises_and_rolls_back_the_whole_batch(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a stored job without a revision
        q = leaseq_store.queue()
        q.enqueue("taken", {"v": 1})
        journal = q.journal("taken")
        # When a batch holds a new job and another payload for that id
        with pytest.raises(JobConflict) as raised:
            q.enqueue_many([{"job_id": "new", "payload": {}},
                            {"job_id": "taken", "payload": {"v": 2}}])
        # Then nothing of the batch was written
        assert raised.value.job_ids == ["taken"]
        assert q.get("new") is None
        assert must_get(q, "taken").payload == {"v": 1}
        assert q.journal("taken") == journal
        assert q.journal("new") == []

    def test_conflict_keep_leaves_the_job(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {"v": 1})
        result = q.enqueue("j1", {"v": 2}, on_conflict="keep")
        assert result.outcome == "conflict"
        assert must_get(q, "j1").payload == {"v": 1}

    def test_conflict_replace_takes_the_new_payload(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {"v": 1}, revision="r1")
        q.enqueue("j2", {"v": 1})
        assert q.enqueue("j2", {"v": 2}, on_conflict="replace").outcome == "updated"
        job = must_get(q, "j2")
        assert (job.payload, job.revision) == ({"v": 2}, None)

    def test_replayed_batch_changes_nothing(self, leaseq_store: FreshStore) -> None:
        # Given a batch of 50 jobs, half with revisions
        q = leaseq_store.queue()
        batch = [q.spec(f"j{i:02d}", {"i": i}, revision=f"r{i}" if i % 2 else None)
                 for i in range(50)]
        q.enqueue_many(batch)
        ids = [s.job_id for s in batch]
        stored, journal = [must_get(q, i) for i in ids], _journal_sizes(q, ids)
        advance(leaseq_store.store, 5)
        # When it is sent again, Then every job is unchanged: no write, no event
        assert {r.outcome for r in q.enqueue_many(batch)} == {"unchanged"}
        assert [must_get(q, i) for i in ids] == stored
        assert _journal_sizes(q, ids) == journal

    def test_awkward_text_round_trips_through_a_batch(self, leaseq_store: FreshStore) -> None:
        # Given a batch whose ids, tasks, revisions and keys hold quotes, backslashes, JSON
        # syntax, control characters and non-ASCII text, with nested payloads
        q = leaseq_store.queue()
        texts = ['q"uo\'te', "back\\slash\\", "ünï©ødé 😀", '[1,{"a":null}]', "null",
                 "tab\tnew\nline"]
        batch = [q.spec(t, {"t": t, "nested": ROUND_TRIP}, task=f"task {t}",
                        revision=t if i % 2 else None, delay_s=i * 10.25, max_attempts=i + 1,
                        priority=-i, concurrency_key=f"key {t}")
                 for i, t in enumerate(texts)]
        # When it is enqueued
        assert [r.outcome for r in q.enqueue_many(batch)] == ["created"] * len(texts)
        # Then each job holds exactly what its spec said, and the batch replays as unchanged
        for i, t in enumerate(texts):
            job = must_get(q, t)
            assert (job.id, job.payload, job.task, job.revision, job.max_attempts) == (
                t, {"t": t, "nested": ROUND_TRIP}, f"task {t}", t if i % 2 else None, i + 1)
            assert (job.priority, job.concurrency_key) == (-i, f"key {t}")
            assert job.lease_until is not None and job.created_at is not None
            delay = (job.lease_until - job.created_at).total_seconds()
            assert delay == pytest.approx(i * 10.25, abs=CLOCK_SLACK_S)
        assert [r.outcome for r in q.enqueue_many(batch)] == ["unchanged"] * len(texts)

    def test_duplicate_ids_in_one_batch_see_each_other(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        results = q.enqueue_many([q.spec("a", {"v": 1}), q.spec("a", {"v": 1}),
                                  q.spec("b", {"v": 1}, revision="r1"),
                                  q.spec("b", {"v": 2}, revision="r2")])
        assert [r.outcome for r in results] == ["created", "unchanged", "created", "updated"]
        assert must_get(q, "b").payload == {"v": 2}
        with pytest.raises(JobConflict):
            q.enqueue_many([q.spec("c", {"v": 1}), q.spec("c", {"v": 2})])
        assert q.get("c") is None

    def test_journal_records_enqueue_outcomes(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {}, revision="r1")
        q.enqueue("j1", {}, revision="r1")
        q.enqueue("j1", {}, revision="r2")
        journal = q.journal("j1")
        assert [(e.event, e.reason) for e in journal] == [
            ("enqueued", "created"), ("enqueued", "updated")]

    @pytest.mark.parametrize("bad", sorted(BAD_JOBS))
    def test_bad_job_refuses_the_batch_before_writing(
        self, leaseq_store: FreshStore, bad: str
    ) -> None:
        q = leaseq_store.queue()
        with pytest.raises(InvalidInput):
            q.enqueue_many([{"job_id": "good", "payload": {"ok": 1}}, BAD_JOBS[bad]])
        assert q.counts() == {}
        assert leaseq_store.store.queues() == []

    def test_bad_queue_name_or_policy_is_refused(self, leaseq_store: FreshStore) -> None:
        with pytest.raises(InvalidQueueName):
            leaseq_store.store.queue("no spaces")
        with pytest.raises(InvalidPolicy):
            leaseq_store.store.queue("jobs", max_attempt=3)
        assert leaseq_store.store.queues() == []

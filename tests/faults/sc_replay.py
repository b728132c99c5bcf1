"""Scenario 7, producer replay: 16 producer threads each enqueue every key several times, in
their own order, in batches and one by one → exactly one job per key, ``created`` exactly once
per key; the same key with another payload → ``JobConflict``, nothing written."""

from __future__ import annotations

import random
import threading

from leaseq import JobConflict, StoreUnavailable
from leaseq.job import EnqueueOutcome
from leaseq.testing.chaos import Run, jobs_by_id

THREADS = 16
BATCH = 50


def run(r: Run) -> None:
    keys, rounds = r.size(400, 1000), r.size(3, 10)
    store = r.open()
    q = store.queue("chaos")
    payload = {k: {"key": k, "body": f"v1-{k}"} for k in (f"key-{i:05d}" for i in range(keys))}
    outcomes: dict[EnqueueOutcome, int] = {}
    created: dict[str, int] = {}
    errors: list[str] = []
    transient: list[str] = []
    lock = threading.Lock()

    def again(call):  # type: ignore[no-untyped-def]
        """Call, and again when told "try again" (as the error says to), counting it."""
        for _ in range(20):
            try:
                return call()
            except StoreUnavailable as exc:
                with lock:
                    transient.append(str(exc)[:200])
        raise AssertionError("still unavailable after 20 tries")

    def send(chunk: list[str], one_by_one: bool) -> list:  # type: ignore[type-arg]
        if one_by_one:
            return [again(lambda k=k: q.enqueue(k, payload[k], task="echo")) for k in chunk]
        return again(lambda: q.enqueue_many([q.spec(k, payload[k], task="echo")
                                             for k in chunk]))

    def producer(index: int) -> None:
        rng = random.Random(f"{r.seed}:{index}")
        order = [k for _ in range(rounds) for k in payload]
        rng.shuffle(order)
        try:
            for start in range(0, len(order), BATCH):
                chunk = order[start:start + BATCH]
                one_by_one = rng.random() < 0.2  # the rest in one transaction per batch
                results = send(chunk, one_by_one)
                with lock:
                    for res in results:
                        outcomes[res.outcome] = outcomes.get(res.outcome, 0) + 1
                        if res.outcome is EnqueueOutcome.CREATED:
                            created[res.job_id] = created.get(res.job_id, 0) + 1
        except Exception as exc:  # reported as a violation, not a crash of the thread
            errors.append(f"producer {index}: {type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = jobs_by_id(q)
    r.counts.jobs_in = THREADS * keys * rounds
    r.counts.terminal_out = len(jobs)  # here: jobs that exist
    r.counts.lost = sum(1 for k in payload if k not in jobs)
    r.counts.max_attempts_seen = max((j.attempts for j in jobs.values()), default=0)
    r.log("replayed", outcomes={str(k): v for k, v in outcomes.items()})
    r.check("no producer failed", not errors, "; ".join(errors[:3]))
    r.check("a replay never raised (no StoreUnavailable to retry)", not transient,
            f"{len(transient)} times: {transient[:1]}")
    r.check(f"exactly {keys} jobs", len(jobs) == keys, f"{len(jobs)} jobs")
    r.check("created exactly once per key", sorted(created.values()) == [1] * keys,
            f"{sum(created.values())} created for {keys} keys")
    r.check("every other enqueue unchanged",
            outcomes.get(EnqueueOutcome.UNCHANGED, 0) == THREADS * keys * rounds - keys,
            str(outcomes))
    r.check("payloads stored exactly", all(jobs[k].payload == payload[k] for k in payload))
    # The same key with another payload: a conflict, in a batch it rolls the batch back.
    some = sorted(payload)[:10]
    before = jobs_by_id(q)
    conflicts = 0
    for k in some:
        try:
            q.enqueue_many([q.spec("fresh-" + k, {"x": 1}, task="echo"),
                            q.spec(k, {"key": k, "body": "v2"}, task="echo")])
        except JobConflict as exc:
            conflicts += exc.job_ids == [k]
    keep = [q.enqueue(k, {"key": k, "body": "v2"}, task="echo", on_conflict="keep").outcome
            for k in some]
    r.check("another payload for a key → JobConflict naming it", conflicts == len(some),
            f"{conflicts} of {len(some)}")
    r.check("on_conflict='keep' → conflict outcome", set(keep) == {EnqueueOutcome.CONFLICT},
            str(keep))
    r.check("a conflicting batch wrote nothing", jobs_by_id(q) == before)

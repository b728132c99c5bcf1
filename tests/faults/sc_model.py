"""Scenario 11, a Hypothesis state machine: the Queue API against a small pure model.

Time is the store's clock, moved with ``time_offset_s``; the model keeps logical time in the
same steps. Every duration is a multiple of 5 s while the test's own run time is well under
5 s per example, so no comparison ever lands on a boundary: the facts compared are exact
(status, attempts, lease_epoch, failure, which leases are held, the set a claim returns, what
``ready`` and ``counts`` say, whether a stale write is refused). Stale leases are kept and
written with on purpose; "crash" forgets a worker's leases without telling the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from leaseq import JobConflict, LeaseLost
from leaseq.job import EnqueueOutcome, Job
from leaseq.stores.base import Store
from leaseq.testing.chaos import Run

# Off the 5 s grid of advances and delays: the store's clock keeps moving while a step runs, so
# a lease ending exactly on a model instant would be expired for the store and not the model.
LEASE_S = 27.5
IDS = ("a", "b", "c", "d")
WORKERS = ("w1", "w2")
MAX_ATTEMPTS = 3


@dataclass
class M:
    """The model of one job."""

    status: str = "pending"
    attempts: int = 0
    epoch: int = 0
    until: float = 0.0  # lease_until (processing) or not-before (pending), logical seconds
    payload: int = 0
    failure: str | None = None


class Tally:
    refused = accepted = steps = 0


def machine(store: Store, tally: Tally) -> type[RuleBasedStateMachine]:
    counter = [0]

    class QueueModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            counter[0] += 1
            self.q = store.queue(f"model-{counter[0]}", max_attempts=MAX_ATTEMPTS)
            self.t = 0.0
            self.jobs: dict[str, M] = {}
            self.leases: list[tuple[str, Job]] = []  # (worker, claimed job), stale ones too
            self.crashed: set[str] = set()

        # --- the model's predicates ---

        def held(self, job: Job) -> bool:
            m = self.jobs[job.id]
            return m.status == "processing" and m.epoch == job.lease_epoch

        def claimable(self) -> set[str]:
            return {i for i, m in self.jobs.items() if m.attempts < MAX_ATTEMPTS and (
                (m.status == "pending" and m.until <= self.t)
                or (m.status == "processing" and m.until < self.t))}

        def pick(self, data: st.DataObject) -> tuple[str, Job] | None:
            if not self.leases:
                return None
            return data.draw(st.sampled_from(self.leases))

        # --- rules ---

        @rule(job_id=st.sampled_from(IDS), payload=st.integers(0, 1), delay=st.sampled_from(
            [0, 15]))
        def enqueue(self, job_id: str, payload: int, delay: int) -> None:
            m = self.jobs.get(job_id)
            try:
                result = self.q.enqueue(job_id, {"p": payload}, delay_s=delay,
                                        max_attempts=MAX_ATTEMPTS)
            except JobConflict:
                assert m is not None and m.payload != payload
                return
            if m is None:
                assert result.outcome == EnqueueOutcome.CREATED
                self.jobs[job_id] = M(until=self.t + delay, payload=payload)
            else:
                assert m.payload == payload and result.outcome == EnqueueOutcome.UNCHANGED

        @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
        def claim(self, worker: str, limit: int) -> None:
            ready = self.claimable()
            got = self.q.claim(worker, limit, lease_s=LEASE_S)
            ids = {j.id for j in got}
            assert ids <= ready, f"claimed {ids - ready} that the model says are not ready"
            assert len(ids) == len(got) == min(limit, len(ready))
            self.crashed.discard(worker)
            for job in got:
                m = self.jobs[job.id]
                m.status, m.attempts, m.epoch = "processing", m.attempts + 1, m.epoch + 1
                m.until = self.t + LEASE_S
                assert (job.attempts, job.lease_epoch) == (m.attempts, m.epoch)
                self.leases.append((worker, job))

        @rule(data=st.data())
        def heartbeat(self, data: st.DataObject) -> None:
            chosen = data.draw(st.lists(st.sampled_from(self.leases), max_size=3, unique_by=(
                lambda wj: wj[1].id))) if self.leases else []
            jobs = [j for _, j in chosen]
            want_lost = [j.id for j in jobs if not self.held(j)]
            lost = self.q.heartbeat(jobs, lease_s=LEASE_S)
            assert lost == want_lost
            self._tally(len(want_lost), 0)
            for j in jobs:
                if self.held(j):
                    self.jobs[j.id].until = self.t + LEASE_S

        @rule(data=st.data(), action=st.sampled_from(["complete", "retry", "snooze", "fail"]),
              delay=st.sampled_from([0, 15, 35]))
        def finish(self, data: st.DataObject, action: str, delay: int) -> None:
            picked = self.pick(data)
            if picked is None:
                return
            _, job = picked
            held = self.held(job)
            try:
                if action == "complete":
                    self.q.complete(job, {"ok": 1})
                elif action == "retry":
                    self.q.retry_later(job, "boom", delay)
                elif action == "snooze":
                    self.q.snooze(job, delay)
                else:
                    self.q.fail(job, "bad", "permanent")
            except LeaseLost:
                assert not held, f"{action} of a held lease was refused"
                self._tally(1, 0)
                return
            if not held:
                self._tally(0, 1)
                raise AssertionError(f"stale {action} (epoch {job.lease_epoch}) was accepted")
            m = self.jobs[job.id]
            if action == "complete":
                m.status = "done"
            elif action == "fail" or (action == "retry" and m.attempts >= MAX_ATTEMPTS):
                m.status = "failed"
                m.failure = "permanent" if action == "fail" else "exhausted"
            else:
                m.status, m.until = "pending", self.t + delay
                if action == "snooze":
                    m.attempts = max(m.attempts - 1, 0)

        @rule(seconds=st.sampled_from([5, 10, 20, 30]))
        def advance(self, seconds: int) -> None:
            store.time_offset_s += seconds
            self.t += seconds

        @rule()
        def reclaim(self) -> None:
            want_failed = want_returned = 0
            for m in self.jobs.values():
                if m.status == "processing" and m.until < self.t:
                    if m.attempts >= MAX_ATTEMPTS:
                        m.status, m.failure = "failed", "expired"
                        want_failed += 1
                    else:
                        m.status, m.until = "pending", self.t
                        want_returned += 1
            assert self.q.reclaim_expired() == (want_failed, want_returned)

        @rule(worker=st.sampled_from(WORKERS))
        def crash(self, worker: str) -> None:
            """The worker dies: the store is not told; its leases live on as stale tokens."""
            self.crashed.add(worker)

        @rule(job_id=st.sampled_from(IDS))
        def operator_requeue(self, job_id: str) -> None:
            m = self.jobs.get(job_id)
            if m is None:
                return
            terminal = m.status not in ("pending", "processing")
            assert self.q.requeue(job_id) == terminal
            if terminal:
                m.status, m.attempts, m.failure, m.until = "pending", 0, None, self.t

        @rule(job_id=st.sampled_from(IDS))
        def cancel(self, job_id: str) -> None:
            m = self.jobs.get(job_id)
            if m is None:
                return
            ok = m.status in ("pending", "processing", "failed")
            assert self.q.cancel(job_id) == ok
            if ok:
                m.status = "cancelled"

        def _tally(self, refused: int, accepted: int) -> None:
            tally.refused += refused
            tally.accepted += accepted

        # --- the store and the model agree ---

        @invariant()
        def agree(self) -> None:
            tally.steps += 1
            for job_id, m in self.jobs.items():
                job = self.q.get(job_id)
                assert job is not None
                seen = (job.status, job.attempts, job.lease_epoch)
                assert seen == (m.status, m.attempts, m.epoch), f"{job_id}: {seen} vs {m}"
                if m.status == "failed":
                    assert job.failure == m.failure, f"{job_id}: {job.failure} vs {m.failure}"
            assert self.q.ready() == len(self.claimable())
            counts: dict[str, int] = {}
            for m in self.jobs.values():
                counts[m.status] = counts.get(m.status, 0) + 1
            assert self.q.counts() == counts

    return QueueModel


def run(r: Run) -> None:
    store = r.open()
    tally = Tally()
    cls = machine(store, tally)
    hypothesis_seed(r.seed)(cls)
    run_state_machine_as_test(cls, settings=settings(
        max_examples=r.size(25, 300), stateful_step_count=r.size(30, 60), deadline=None,
        database=None, suppress_health_check=list(HealthCheck), print_blob=True))
    r.counts.stale_refused, r.counts.stale_accepted = tally.refused, tally.accepted
    r.counts.jobs_in = tally.steps
    r.log("model", steps=tally.steps, refused=tally.refused)
    r.check("the store and the model never disagreed", True)

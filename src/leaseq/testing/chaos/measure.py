"""What every scenario measures the same way: waiting for a state, and ``settle``, the checks
each worker scenario shares (no job lost, each terminal once, attempts within the limit,
effects unique), read from the store's records, its journal and the ledger."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Sequence

from leaseq.job import Job, is_terminal
from leaseq.journal import JournalEvent
from leaseq.queue import Queue
from leaseq.testing.chaos.ledger import Ledger
from leaseq.testing.chaos.run import Run


def jobs_by_id(q: Queue) -> dict[str, Job]:
    """Every job of the queue, by id."""
    return {job.id: job for job in q.iter_jobs()}


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def all_terminal(q: Queue, ids: Iterable[str]) -> Callable[[], bool]:
    wanted = set(ids)

    def done() -> bool:
        counts = q.counts()
        live = counts.get("pending", 0) + counts.get("processing", 0)
        return live == 0 and sum(counts.values()) >= len(wanted)
    return done


def settle(r: Run, q: Queue, ids: Sequence[str], ledger: Ledger | None, *,
           reruns_allowed: bool, effect_expected: Callable[[Job], bool] | None = None
           ) -> dict[str, Job]:
    """The checks every worker scenario shares, from the records and the ledger: no job lost,
    each terminal exactly once in its journal, attempts within the limit, effects unique."""
    jobs = jobs_by_id(q)
    c = r.counts
    c.jobs_in = len(ids)
    missing = [i for i in ids if i not in jobs]
    live = [i for i in ids if i in jobs and not is_terminal(jobs[i].status)]
    c.terminal_out = sum(1 for i in ids if i in jobs and is_terminal(jobs[i].status))
    c.lost = len(missing) + len(live)
    c.max_attempts_seen = max((jobs[i].attempts for i in ids if i in jobs), default=0)
    over = [i for i in ids if i in jobs and jobs[i].attempts > jobs[i].max_attempts]
    r.check("no job lost (every job terminal)", c.lost == 0,
            f"missing {missing[:5]}, still live {[(i, jobs[i].status) for i in live[:5]]}")
    r.check("attempts ≤ max_attempts", not over, f"over: {over[:5]}")
    finishes, finished_at = _finishes(q, [i for i in ids if i in jobs])
    twice = [i for i, n in finishes.items() if n != 1 and is_terminal(jobs[i].status)]
    r.check("each job terminal exactly once (journal)", not twice,
            f"{[(i, finishes[i]) for i in twice[:5]]}")
    if ledger is not None:
        dupes, reruns, details = ledger.classify(jobs, finished_at)
        c.duplicate_effects, c.fenced_reruns = dupes, reruns
        r.check("0 duplicate effects", dupes == 0, "; ".join(details[:5]))
        if not reruns_allowed:
            r.check("0 re-runs (nothing was killed)", reruns == 0, f"{reruns} re-runs")
        expected = effect_expected or (lambda j: j.status == "done")
        have = {job_id for job_id, _ in ledger.effects()}
        without = [i for i in ids if i in jobs and expected(jobs[i]) and i not in have]
        r.check("every finished job made its effect", not without, f"{without[:5]}")
    return jobs


_FINISH_EVENTS = (JournalEvent.RESULT_SAVED, JournalEvent.QUARANTINED, JournalEvent.CANCELLED)


def _finishes(q: Queue, ids: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per job, how many terminal transitions its journal holds (revivals excluded), and the
    lease epoch of the first one (when the journal names it)."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i in ids:
        ends = [e for e in q.journal(i) if e.event in _FINISH_EVENTS]
        counts[i] = len(ends)
        epochs = [e.lease_epoch for e in ends if e.lease_epoch is not None]
        if epochs:
            first[i] = epochs[0]
    return counts, first


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""What the conformance suite runs against, and the helpers its tests share.

A store under test is made by a ``StoreFactory``: a fresh, empty store per test, plus the URL
and options that let *another process* open the same database (the multi-process races need
that), and a clean-up. Time is advanced through the store's test-only ``time_offset_s``, never
by sleeping.
"""

from __future__ import annotations

import datetime as _datetime_module
import multiprocessing
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from leaseq.job import Job, JournalEntry, Lease
from leaseq.queue import Queue
from leaseq.stores import connect
from leaseq.stores.base import Store

W1 = "host-a:101:aaaa0001"
W2 = "host-b:202:bbbb0002"
#: Long enough that no lease lapses by itself during a test; expiry is always made on purpose.
LONG_LEASE_S = 600.0
#: Slack for comparing two readings of the store's clock taken around a call, on the side a
#: slow machine cannot move (the readings only move apart: see ``within_readings``).
CLOCK_SLACK_S = 0.5
#: How far a store may round the times it keeps (MongoDB keeps milliseconds).
TIME_ROUNDING_S = 0.002


@dataclass(frozen=True)
class FreshStore:
    """A new, empty store for one test, and how other processes reach the same database."""

    store: Store
    url: str
    """A URL ``leaseq.connect`` opens the same database with (password unmasked)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options for ``leaseq.connect``, alongside ``url``."""
    transaction: Callable[[], AbstractContextManager[Any]] | None = None
    """Opens the caller's own transaction on this database, as a user would: a context
    manager that yields what ``enqueue_many(connection=…)`` takes, in an open transaction;
    it commits when the block ends and rolls back when the block raises. None: the tests of
    ``connection=`` skip (the store's other transaction tests still run)."""

    def open(self) -> Store:
        """Another connection to the same database (the caller closes it)."""
        return connect(self.url, **self.options)

    def queue(self, name: str = "jobs", **policy: Any) -> Queue:
        return self.store.queue(name, **policy)


class StoreFactory(Protocol):
    """Makes the stores the conformance suite runs on. Implement this for a third-party store."""

    def create(self) -> FreshStore:
        """A new, empty, migrated store that no other test can see (own file, schema,
        database or collection prefix)."""
        ...

    def destroy(self, fresh: FreshStore) -> None:
        """Delete everything ``create`` made and close the store."""
        ...


@contextmanager
def fresh_store(factory: StoreFactory) -> Iterator[FreshStore]:
    """``create`` then, whatever happens in the test, ``destroy``: the body of a fixture."""
    fresh = factory.create()
    try:
        yield fresh
    finally:
        factory.destroy(fresh)


# --- time ----------------------------------------------------------------------------------


def seconds_until(store: Store, moment: datetime | None) -> float:
    """Seconds from the store's now to ``moment`` (a job's ``lease_until``, which a test
    passes only where the job has one)."""
    assert moment is not None, "the job has no lease_until here"
    return (moment - store.server_now()).total_seconds()


def within_readings(low: float, high: float, *, shortest: float, longest: float) -> bool:
    """Whether a duration the store set, known to lie in ``[low, high]``, fits two readings
    of it taken around the call that set it: ``shortest`` measured from the store's clock
    read after the call, ``longest`` from the one read before (so the true value lies
    between them). The only claim a slow machine cannot break: a stall between the readings
    widens them, never moves them past the truth; in an ordinary run they are milliseconds
    apart, so a wrong duration still shows."""
    return shortest - TIME_ROUNDING_S <= high and low <= longest + TIME_ROUNDING_S


def advance(store: Store, seconds: float) -> None:
    """Move the store's clock forward."""
    store.time_offset_s += seconds


def advance_past(store: Store, moment: datetime | None, margin_s: float = 0.05) -> None:
    """Move the store's clock to just after ``moment`` (never backwards)."""
    advance(store, max(seconds_until(store, moment) + margin_s, 0.0))


def set_clock_before(store: Store, moment: datetime | None, margin_s: float = 1.0) -> None:
    """Move the store's clock to ``margin_s`` before ``moment`` (backwards if need be)."""
    advance(store, seconds_until(store, moment) - margin_s)


@contextmanager
def shifted_clock(offset_s: float, modules: Sequence[str] = ("leaseq",)) -> Iterator[None]:
    """Shift *Python's* clock (``time.time``, ``time.time_ns``, ``datetime.now``…) by
    ``offset_s`` in this process, including names bound by ``from … import`` in the modules
    under the given prefixes. A store that writes its timestamps from its server's clock must
    not notice.
    """
    fakes = _clock_fakes(offset_s)
    _swap_clock(fakes, modules)
    try:
        yield
    finally:
        _swap_clock({fake: real for real, fake in fakes.items()}, modules)


def _clock_fakes(offset_s: float) -> dict[Any, Any]:
    real_datetime, real_time, real_time_ns = datetime, time.time, time.time_ns

    class AnyDatetime(type):
        # The shifted class stands in for ``datetime`` in leaseq's modules, whose checks
        # (``isinstance(value, datetime)``) must still take a datetime made outside the block.
        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, real_datetime)

    class ShiftedDatetime(datetime, metaclass=AnyDatetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real_datetime.now(tz) + timedelta(seconds=offset_s)

        @classmethod
        def utcnow(cls) -> Any:
            return real_datetime.now(_datetime_module.UTC).replace(tzinfo=None) + timedelta(
                seconds=offset_s
            )

        @classmethod
        def today(cls) -> Any:
            return cls.now()

    return {
        real_datetime: ShiftedDatetime,
        real_time: lambda: real_time() + offset_s,
        real_time_ns: lambda: real_time_ns() + int(offset_s * 1e9),
    }


def _swap_clock(swaps: Mapping[Any, Any], prefixes: Sequence[str]) -> None:
    """Rebind every clock in ``swaps`` to its replacement, in ``time``, ``datetime`` and the
    named modules. Run again with the mapping reversed, it also catches modules imported while
    the clock was shifted."""
    names = [n for n in list(sys.modules) if n in ("time", "datetime") or n.startswith(
        tuple(prefixes))]
    for name in names:
        module = sys.modules.get(name)
        for attr, value in list(vars(module).items()) if module else ():
            try:
                replacement = swaps.get(value)
            except TypeError:  # unhashable module attribute: not a clock
                continue
            if replacement is not None:
                setattr(module, attr, replacement)


# --- processes -----------------------------------------------------------------------------


def wait_until(condition: Callable[[], Any], what: str = "", *, timeout_s: float = 30.0,
               poll_s: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail with an
    ``AssertionError`` naming ``what`` after ``timeout_s``. For what another thread or process
    does on its own time (a worker's claim, a scheduler's tick); what the test itself can
    cause, it causes instead (``advance``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")


def run_processes(
    target: Callable[..., Any], args_per_process: Sequence[tuple[Any, ...]], timeout_s: float = 60
) -> list[Any]:
    """Run ``target(*args)`` in one fresh ``spawn`` process per args tuple (the same start as
    on macOS and Windows: nothing is inherited but the arguments); their return values, in
    order. A child's exception fails the test with the child's traceback."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_report, args=(out, i, target, args), daemon=True)
             for i, args in enumerate(args_per_process)]
    for proc in procs:
        proc.start()
    try:
        reports = sorted(out.get(timeout=timeout_s) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    failures = [text for _, ok, text in reports if not ok]
    assert not failures, "a child process failed:\n" + "\n".join(failures)
    return [value for _, _, value in reports]


def _report(out: Any, index: int, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        out.put((index, True, target(*args)))
    except BaseException:
        out.put((index, False, traceback.format_exc()))


# --- given ---------------------------------------------------------------------------------


def given_jobs(q: Queue, n: int, prefix: str = "job", **spec: Any) -> list[str]:
    """``n`` ready jobs with ids ``prefix-00000``…, enqueued in one call."""
    ids = [f"{prefix}-{i:05d}" for i in range(n)]
    q.enqueue_many([q.spec(job_id, {"n": i}, **spec) for i, job_id in enumerate(ids)])
    return ids


def given_claimed(q: Queue, job_id: str = "j1", worker_id: str = W1,
                  lease_s: float = LONG_LEASE_S, **spec: Any) -> Job:
    """One job enqueued and claimed by ``worker_id``."""
    q.enqueue(job_id, {"name": job_id}, **spec)
    job = q.claim_one(job_id, worker_id, lease_s=lease_s)
    assert job is not None, f"job {job_id} was not claimable right after enqueue"
    return job


def given_stolen(q: Queue, job_id: str = "j1", lease_s: float = 60.0) -> tuple[Job, Job]:
    """A job claimed by W1, its lease run out, then claimed by W2: ``(old, new)``."""
    old = given_claimed(q, job_id, W1, lease_s=lease_s)
    advance_past(q.store, old.lease_until)
    (new,) = q.claim(W2, lease_s=LONG_LEASE_S)
    assert new.id == job_id
    return old, new


def leases(q: Queue, *job_ids: str) -> list[Lease]:
    """The jobs' leases as they stand (what a dispatcher read from ``outbox_due``); a missing
    job gets epoch 0."""
    return [Lease(i, job.lease_epoch if (job := q.get(i)) else 0) for i in job_ids]


def events(entries: Sequence[JournalEntry]) -> list[str]:
    return [e.event for e in entries]


def must_get(q: Queue, job_id: str) -> Job:
    job = q.get(job_id)
    assert job is not None, f"job {job_id!r} is missing"
    return job

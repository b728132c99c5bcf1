"""``App`` and ``@app.task``: a registry of tasks, typed enqueue, and the handlers a worker runs.

A task is a plain function (``def`` or ``async def``) whose keyword arguments are the job's
payload. The payload is checked against the signature twice: when it is enqueued (a wrong or
missing argument raises ``PayloadMismatch`` and nothing is written) and again when a worker runs
it (a payload that no longer fits — the code changed while the job waited — is quarantined as
``failed(invalid)``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from leaseq import validate
from leaseq.aio import AsyncAppMethods, AsyncTaskMethods
from leaseq.errors import InvalidInput, InvalidPayload, LeaseqError

# PayloadMismatch lives with the other errors; it is imported from here too, where it was.
from leaseq.errors import PayloadMismatch as PayloadMismatch
from leaseq.job import EnqueueResult, Job, JobSpec, OnConflict
from leaseq.policy import QueuePolicy
from leaseq.queue import Queue
from leaseq.redact import Redact, guarded, redact
from leaseq.scheduler.spec import TICK_PARAM, CatchUp, Overlap, Schedule
from leaseq.stores import connect
from leaseq.stores.base import Store

DEFAULT_QUEUE = "default"

#: Keyword arguments of ``Task.enqueue`` that are options, not payload; a task may not use them
#: as parameter names.
ENQUEUE_OPTIONS = frozenset({"job_id", "revision", "delay_s", "on_conflict", "connection",
                             "priority", "concurrency_key"})

#: Task options that are queue-policy fields (the rest of ``@app.task``'s keywords are its own).
_POLICY_OPTIONS = frozenset({"max_attempts", "lease_s", "heartbeat_every_s", "backoff_base_s",
                             "backoff_cap_s", "snooze_s", "max_snoozes", "max_givebacks"})


@dataclass(frozen=True, slots=True)
class Finish:
    """What a handler may return instead of a plain result to say more about the finish.

    ``status``: ``"done"`` or an app terminal status (``"skipped_too_large"``, ``"tombstone"``).
    ``then``: follow-up jobs written in the same transaction as the result, as returned by
    ``Task.spec(...)`` (``(queue, JobSpec)`` pairs).
    """

    result: Any = None
    status: str = "done"
    result_key: str | None = None
    then: Sequence[tuple[str, JobSpec]] = ()


class App(AsyncAppMethods):
    """A registry of tasks over one store.

    ``url`` defaults to ``$LEASEQ_URL``, then ``sqlite:///leaseq.db``; the store is opened on
    first use (not at import), so a module that defines an ``App`` can be imported anywhere.
    ``queues`` sets per-queue policy options, e.g. ``{"thumbnails": {"lease_s": 60}}``.
    ``redact`` masks secrets in every error text and reason written to the journal, the record
    and the worker's logs: ``leaseq.redact.redact`` by default; a ``Redactor(...)`` or any
    ``str -> str`` function replaces it (the built-in one stands in where it fails).
    """

    def __init__(self, url: str | None = None, *, store: Store | None = None,
                 queues: Mapping[str, Mapping[str, Any] | QueuePolicy] | None = None,
                 redact: Redact = redact):
        if not callable(redact):
            raise InvalidInput("redact must be a function from str to str, e.g. a Redactor")
        self.redact = guarded(redact)
        self.url = url
        self._store = store
        self._lock = threading.Lock()
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}
        self._policies: dict[str, QueuePolicy] = {}
        self._queues: dict[str, Queue] = {}
        for name, options in (queues or {}).items():
            self.configure_queue(name, options)

    def __repr__(self) -> str:
        return f"<App tasks={sorted(self._tasks)}>"

    @classmethod
    def from_ref(cls, ref: str) -> App:
        """The ``App`` that ``"module:attribute"`` names (e.g. ``"myproject.tasks:app"``), as
        ``leaseq worker MODULE:APP`` finds it. The current directory is importable, as it is for
        ``python -m``. Raises ``InvalidInput`` for a malformed reference, a module that cannot
        be imported (not found, or an import inside it failed), or an attribute that is not an
        ``App``. Any other error the module's own code raises while it runs (a SyntaxError, a
        missing setting) goes on as it is, with its traceback: that is the place to look."""
        module_name, sep, attribute = ref.partition(":")
        if not sep or not module_name or not attribute:
            raise InvalidInput(f"expected MODULE:APP (e.g. myproject.tasks:app), got {ref!r}")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise InvalidInput(f"cannot import module {module_name!r}: {exc}") from None
        parts = attribute.split(".")
        for depth, part in enumerate(parts):
            if not hasattr(target, part):
                owner = (f"module {module_name!r}" if depth == 0
                         else repr(f"{module_name}:{'.'.join(parts[:depth])}"))
                raise InvalidInput(f"cannot find {ref!r}: {owner} has no attribute {part!r}")
            target = getattr(target, part)
        if not isinstance(target, cls):
            raise InvalidInput(f"{ref!r} is not a leaseq.App (got {type(target).__name__})")
        return target

    # --- set-up ----------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The store, opened on first use."""
        with self._lock:
            if self._store is None:
                self._store = connect(self.url)
            return self._store

    def has_open_store(self) -> bool:
        """Whether the store is open already (then ``queue()`` does no I/O)."""
        return self._store is not None

    def use_store(self, store: Store) -> None:
        """Work on this store from now on (the worker CLI's ``--url`` wins over the app's)."""
        with self._lock:
            self._store = store
            self._queues.clear()

    def close_store(self) -> None:
        """Close the store and forget it (and the queue handles on it): the next use opens a
        fresh one from ``url``, as a second start of a server's lifespan does."""
        with self._lock:
            store, self._store = self._store, None
            self._queues.clear()
        if store is not None:
            store.close()

    def configure_queue(self, name: str, options: Mapping[str, Any] | QueuePolicy) -> None:
        """Set a queue's policy (before tasks of that queue are registered)."""
        validate.queue_name(name)
        if name in {t.queue for t in self._tasks.values()}:
            raise InvalidInput(f"configure queue {name!r} before registering its tasks")
        policy = options if isinstance(options, QueuePolicy) else QueuePolicy.build(**options)
        self._policies[name] = policy

    def policy(self, queue: str) -> QueuePolicy:
        return self._policies.get(queue) or QueuePolicy()

    def queue(self, name: str) -> Queue:
        """The ``Queue`` handle for ``name`` with its configured policy (cached)."""
        with self._lock:
            if name not in self._queues:
                store = self._store or connect(self.url)
                self._store = store
                self._queues[name] = Queue(store, name, self.policy(name), redact=self.redact)
            return self._queues[name]

    # --- tasks -----------------------------------------------------------------------------

    def task(self, func: Callable[..., Any] | None = None, *, name: str | None = None,
             queue: str = DEFAULT_QUEUE,
             permanent: type[BaseException] | Iterable[type[BaseException]] = (),
             priority: int = 0, **policy: Any) -> Any:
        """Register a task: ``@app.task`` or ``@app.task(queue=..., max_attempts=..., lease_s=...,
        permanent=(ValueError,), priority=5)``. Policy keywords override the queue's policy for
        this task; ``priority`` is its jobs' default (higher is claimed first)."""
        def register(fn: Callable[..., Any]) -> Task:
            errors: tuple[type[BaseException], ...] = (
                (permanent,) if isinstance(permanent, type) else tuple(permanent))
            task = Task(self, fn, name or fn.__name__, queue, errors, policy, priority=priority)
            if task.name in self._tasks:
                raise InvalidInput(f"a task named {task.name!r} is already registered; "
                                   "pass name= to tell them apart")
            self._tasks[task.name] = task
            return task

        return register(func) if func is not None else register

    @property
    def tasks(self) -> Mapping[str, Task]:
        return types.MappingProxyType(self._tasks)

    # --- periodic jobs (docs/periodic.md) ----------------------------------------------------

    def periodic(self, func: Callable[..., Any] | None = None, *, cron: str | None = None,
                 every_s: float | None = None, timezone: str = "UTC",
                 catch_up: CatchUp = "latest", max_catch_up: int = 100,
                 payload: Mapping[str, Any] | None = None, overlap: Overlap = "allow",
                 schedule_name: str | None = None, **task_options: Any) -> Any:
        """Register a task and its schedule: ``@app.periodic(cron="0 3 * * *",
        timezone="Europe/Kyiv")`` or ``@app.periodic(every_s=60)``. Takes every ``@app.task``
        option too (``name``, ``queue``, ``max_attempts``, ``lease_s``, …); the schedule is
        named after the task unless ``schedule_name`` says otherwise."""
        def register(fn: Callable[..., Any]) -> Task:
            task = self.task(fn, **task_options)
            self.schedule(schedule_name or task.name, task, cron=cron, every_s=every_s,
                          timezone=timezone, catch_up=catch_up, max_catch_up=max_catch_up,
                          payload=payload, overlap=overlap)
            return task

        return register(func) if func is not None else register

    def schedule(self, name: str, task: str | Task, *, cron: str | None = None,
                 every_s: float | None = None, timezone: str = "UTC",
                 catch_up: CatchUp = "latest", max_catch_up: int = 100,
                 payload: Mapping[str, Any] | None = None, overlap: Overlap = "allow"
                 ) -> Schedule:
        """Schedule a registered task: ``app.schedule("sync-drive", sync_drive, every_s=300,
        payload={"drive": "main"})``. The payload is checked against the task's signature now;
        a task with a ``tick`` parameter receives each tick as an aware datetime."""
        found = task if isinstance(task, Task) else self._tasks.get(task)
        if found is None or found.app is not self:
            raise InvalidInput(f"schedule {name!r}: register the task with this app first")
        if name in self._schedules:
            raise InvalidInput(f"a schedule named {name!r} is already registered")
        if payload is not None and not isinstance(payload, Mapping):
            raise InvalidInput(f"schedule {name!r}: payload must be a mapping")
        takes_tick = TICK_PARAM in found.signature.params
        schedule = Schedule(
            name=name, task=found.name, queue=found.queue, cron=cron, every_s=every_s,
            timezone=timezone, catch_up=catch_up, max_catch_up=max_catch_up,
            payload=dict(payload or {}), overlap=overlap,
            max_attempts=found.policy.max_attempts, takes_tick=takes_tick,
            priority=found.priority)
        example = schedule.tick_payload(datetime.now(UTC))  # a tick only for the checks
        found.signature.check(example)
        validate.payload(example, found.policy.max_payload_bytes)
        self._schedules[name] = schedule
        return schedule

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        return types.MappingProxyType(self._schedules)

    def get_task(self, name: str | None) -> Task | None:
        return self._tasks.get(name) if name is not None else None

    def job_policy(self, job: Job) -> QueuePolicy:
        """The policy ``job`` runs under: its task's, else its queue's."""
        task = self.get_task(job.task)
        return task.policy if task else self.policy(job.queue)

    def queue_names(self) -> list[str]:
        """The queues the registered tasks use, sorted."""
        return sorted({t.queue for t in self._tasks.values()})

    # --- producers -------------------------------------------------------------------------

    def enqueue(self, task: str | Task, payload: Mapping[str, Any] | None = None,
                **options: Any) -> EnqueueResult:
        """Enqueue a task by name with a payload dict (see ``Task.enqueue`` for options)."""
        if payload is not None and not isinstance(payload, Mapping):
            raise InvalidPayload(f"a payload must be a JSON object (a dict), got "
                                 f"{type(payload).__name__}")
        return self._find_task(task).enqueue_payload(dict(payload or {}), **options)

    def _find_task(self, task: str | Task) -> Task:
        found = task if isinstance(task, Task) else self._tasks.get(task)
        if found is None:
            raise InvalidInput(f"no task named {str(task)[:100]!r}; known: "
                               f"{', '.join(sorted(self._tasks)) or 'none'}")
        return found

    def enqueue_many(self, specs: Iterable[tuple[str, JobSpec]], *,
                     on_conflict: OnConflict = "raise", connection: Any = None
                     ) -> list[EnqueueResult]:
        """Enqueue ``Task.spec(...)`` results: one transaction per queue (all of them in the
        caller's transaction with ``connection=``). Results come back in the order given. When
        one queue's batch fails, the queues before it stay enqueued (without ``connection=``):
        the error's note names them, and calling again with the same specs is safe (enqueue is
        idempotent by id)."""
        by_queue: dict[str, list[tuple[int, JobSpec]]] = {}
        for index, (queue, spec) in enumerate(specs):
            by_queue.setdefault(queue, []).append((index, spec))
        results: dict[int, EnqueueResult] = {}
        committed: list[str] = []
        for queue, items in by_queue.items():
            try:
                done = self.queue(queue).enqueue_many(
                    [s for _, s in items], on_conflict=on_conflict, connection=connection)
            except LeaseqError as exc:
                if committed and connection is None:
                    exc.add_note(f"the jobs of queue(s) {', '.join(map(repr, committed))} were "
                                 f"enqueued before queue {queue!r} failed (one transaction per "
                                 "queue); calling again with the same specs is safe")
                raise
            committed.append(queue)
            results.update(zip((i for i, _ in items), done, strict=True))
        return [results[i] for i in sorted(results)]


class Task(AsyncTaskMethods):
    """A registered function. Call it directly to run it in-process; ``.enqueue`` to queue it."""

    def __init__(self, app: App, func: Callable[..., Any], name: str, queue: str,
                 permanent: tuple[type[BaseException], ...], policy: Mapping[str, Any], *,
                 priority: int = 0):
        unknown = sorted(set(policy) - _POLICY_OPTIONS)
        if unknown:
            raise InvalidInput(f"unknown task option(s) {', '.join(unknown)}; known: name, "
                               f"queue, permanent, priority, "
                               f"{', '.join(sorted(_POLICY_OPTIONS))}")
        #: The priority of this task's jobs unless an enqueue says otherwise.
        self.priority = validate.priority(priority)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in permanent):
            raise InvalidInput("permanent= takes exception classes, e.g. (ValueError,)")
        validate.queue_name(queue)
        if not validate.text_field(name, 200):  # as every enqueue of it would check
            raise InvalidInput("a task name must be a non-empty string of at most 200 "
                               "characters, valid Unicode without NUL")
        self.app = app
        self.func = func
        self.name = name
        self.queue = queue
        self.permanent = permanent
        self.policy = QueuePolicy.build(app.policy(queue), **policy)
        self.is_async = inspect.iscoroutinefunction(func)
        self.signature = _Signature(func, name)
        #: Whether a ``tick`` in the payload (a schedule's tick, as ISO 8601 text) reaches the
        #: function as an aware datetime: it has a ``tick`` parameter not annotated ``str``.
        #: Known from the function alone, so a worker that never imports the module declaring
        #: the schedule passes the same tick.
        self.takes_tick = (TICK_PARAM in self.signature.params
                           and self.signature.types.get(TICK_PARAM) is not str)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def overrides_lease(self) -> bool:
        return self.policy.lease_s != self.app.policy(self.queue).lease_s

    def spec(self, *args: Any, job_id: str | None = None, revision: str | None = None,
             delay_s: float = 0, priority: int | None = None,
             concurrency_key: str | None = None, **kwargs: Any) -> tuple[str, JobSpec]:
        """``(queue, JobSpec)`` for ``app.enqueue_many`` or ``Finish(then=[...])``."""
        payload = self.signature.payload_from_call(args, kwargs)
        return self.queue, self._spec(payload, job_id, revision, delay_s, priority=priority,
                                      concurrency_key=concurrency_key)

    def enqueue(self, *args: Any, job_id: str | None = None, revision: str | None = None,
                delay_s: float = 0, priority: int | None = None,
                concurrency_key: str | None = None, on_conflict: OnConflict = "raise",
                connection: Any = None, **kwargs: Any) -> EnqueueResult:
        """Enqueue one job; arguments as for calling the function. Idempotent by ``job_id``
        (a new random id when not given). ``priority``: this job's (None: the task's);
        ``concurrency_key``: at most the queue's ``key_limit`` jobs of it run at once.
        ``connection=``: the caller's open transaction."""
        payload = self.signature.payload_from_call(args, kwargs)
        return self.enqueue_payload(payload, job_id=job_id, revision=revision, delay_s=delay_s,
                                    priority=priority, concurrency_key=concurrency_key,
                                    on_conflict=on_conflict, connection=connection)

    def enqueue_payload(self, payload: dict[str, Any], *, job_id: str | None = None,
                        revision: str | None = None, delay_s: float = 0,
                        priority: int | None = None, concurrency_key: str | None = None,
                        on_conflict: OnConflict = "raise", connection: Any = None
                        ) -> EnqueueResult:
        """Enqueue with the payload as a dict (what ``leaseq enqueue`` uses)."""
        self.signature.check(payload)
        spec = self._spec(payload, job_id, revision, delay_s, priority=priority,
                          concurrency_key=concurrency_key)
        queue = self.app.queue(self.queue)
        return queue.enqueue_many([spec], on_conflict=on_conflict, connection=connection)[0]

    def _spec(self, payload: dict[str, Any], job_id: str | None, revision: str | None,
              delay_s: float, *, priority: int | None = None,
              concurrency_key: str | None = None) -> JobSpec:
        queue = self.app.queue(self.queue)
        return queue.spec(job_id if job_id is not None else uuid.uuid4().hex, payload,
                          task=self.name, revision=revision, delay_s=delay_s,
                          max_attempts=self.policy.max_attempts,
                          priority=self.priority if priority is None else priority,
                          concurrency_key=concurrency_key)

    def arguments(self, job: Job) -> dict[str, Any]:
        """The keyword arguments to call the function with for this job (run-time check)."""
        self.signature.check(job.payload)
        kwargs = dict(job.payload)
        if self.takes_tick and isinstance(kwargs.get(TICK_PARAM), str):
            kwargs[TICK_PARAM] = _parse_tick(kwargs[TICK_PARAM])
        if self.signature.job_param:
            kwargs[self.signature.job_param] = job
        return kwargs


class _Signature:
    """The payload-facing view of a task function's signature."""

    def __init__(self, func: Callable[..., Any], name: str):
        self.name = name
        sig = inspect.signature(func)
        hints = _type_hints(func)
        self.job_param = next((p for p in sig.parameters if _is_job(hints.get(p))), None)
        params = [p for p in sig.parameters.values() if p.name != self.job_param]
        for p in params:
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise InvalidInput(f"task {name!r}: parameter {p.name!r} must be passable by "
                                   "keyword (a payload is a JSON object of named arguments)")
            if p.name in validate.RESERVED_KEYS or p.name in ENQUEUE_OPTIONS:
                raise InvalidInput(f"task {name!r}: parameter name {p.name!r} is reserved by "
                                   "leaseq; rename it")
        self.params = {p.name: p for p in params if p.kind is not p.VAR_KEYWORD}
        self.open = any(p.kind is p.VAR_KEYWORD for p in params)
        self.types = {n: hints[n] for n in self.params if n in hints}

    def payload_from_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        names = list(self.params)
        if len(args) > len(names):
            raise PayloadMismatch(f"task {self.name!r} takes at most {len(names)} arguments, "
                                  f"got {len(args)}")
        payload = dict(zip(names, args, strict=False))
        twice = sorted(set(payload) & set(kwargs))
        if twice:
            raise PayloadMismatch(f"task {self.name!r}: argument(s) {', '.join(twice)} given twice")
        payload.update(kwargs)
        self.check(payload)
        return payload

    def check(self, payload: Mapping[str, Any]) -> None:
        """Raise ``PayloadMismatch`` unless the payload fits the signature. Names argument
        names and types, never values."""
        if not isinstance(payload, Mapping):
            raise PayloadMismatch(f"task {self.name!r}: the payload must be a JSON object")
        missing = [n for n, p in self.params.items()
                   if p.default is p.empty and n not in payload]
        unknown = [] if self.open else sorted(set(payload) - set(self.params), key=str)
        problems = []
        if missing:
            problems.append(f"missing argument(s) {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown argument(s) "
                            f"{', '.join(str(k)[:60] for k in unknown[:10])}")
        for name, hint in self.types.items():
            if name in payload and not _fits(payload[name], hint):
                got = type(payload[name]).__name__
                problems.append(f"argument {name!r} should be {_hint_name(hint)}, got {got}")
        if problems:
            raise PayloadMismatch(f"payload does not fit task {self.name!r}: "
                                  + "; ".join(problems))


def _parse_tick(text: str) -> Any:
    """A scheduled tick (ISO 8601 with its offset) as an aware datetime; other text as is
    (a job enqueued by hand may carry anything the signature accepts)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return text


def _type_hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # an annotation that names something not importable here: skip checks
        return {n: a for n, a in getattr(func, "__annotations__", {}).items()
                if not isinstance(a, str) or a in ("Job", "leaseq.Job")}


def _is_job(hint: Any) -> bool:
    return hint is Job or hint in ("Job", "leaseq.Job")


#: Only these plain types are checked; any other annotation is taken on trust.
_CHECKED: dict[Any, tuple[type, ...]] = {
    str: (str,), int: (int,), float: (int, float), bool: (bool,),
    list: (list,), dict: (dict,), type(None): (type(None),),
}


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(hint)
        if not all(_checkable(a) for a in members):
            return True
        return any(_fits(value, a) for a in members)
    base = origin if origin in (list, dict) else hint
    if base not in _CHECKED:
        return True
    if isinstance(value, bool) and base in (int, float):
        return False  # JSON true is not a number
    return isinstance(value, _CHECKED[base])


def _checkable(hint: Any) -> bool:
    return (typing.get_origin(hint) or hint) in _CHECKED


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")

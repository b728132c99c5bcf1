"""What a queue under test offers the scenarios, and the worker-process plumbing they share.

A ``System`` is one queue library on one fresh database (a ``Target``). The scenarios only
enqueue through it, count finished jobs by the library's own record, and start its worker as
a separate OS process, so every library is measured the same way.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.targets import Target

#: Environment variable naming the file where benchmark handlers append "<i> <unix time>".
STARTS_ENV = "LEASEQ_BENCH_STARTS"
#: Environment variable naming a path prefix: handlers keep "<i> <unix time>" in memory, and
#: each worker process writes them to ``<prefix>.<pid>`` when it exits (no I/O per job), and
#: creates ``<prefix>.reached`` once it has recorded ``STAMPS_GOAL_ENV`` starts.
STAMPS_ENV = "LEASEQ_BENCH_STAMPS"
STAMPS_GOAL_ENV = "LEASEQ_BENCH_STAMPS_GOAL"
#: Handler slots of the competitors' workers when no ``--concurrency`` is given.
DEFAULT_SLOTS = 16


@dataclass(frozen=True)
class WorkerSpec:
    """How a scenario wants the worker run."""

    concurrency: int | None  # handler slots per process; None: leaseq at its own default
    burst: bool  # exit when the queue is empty (libraries without it are stopped by signal)
    starts_path: str | None = None  # where handlers record their start time (latency)
    stamps_prefix: str | None = None  # where worker processes write start times at exit
    stamps_goal: int = 0  # starts after which a worker process marks ``<prefix>.reached``

    @property
    def slots(self) -> int:
        """The slots a competitor gets (threads, tasks or batch size): ``concurrency``, or
        ``DEFAULT_SLOTS`` when leaseq runs at its own default."""
        return self.concurrency or DEFAULT_SLOTS


class System(abc.ABC):
    """One queue library on one fresh database. Open it, use it, close it (drops its data)."""

    #: Name shown in tables: "leaseq", "pgqueuer", "procrastinate", "huey", "raw-sql".
    name: str = ""
    #: Store kinds it runs on.
    kinds: tuple[str, ...] = ()
    #: Whether the worker exits by itself once the queue is empty.
    has_burst: bool = True
    #: One line for the table's notes: what "done" means for this library.
    done_means: str = ""

    def __init__(self, target: Target):
        self.target = target

    @abc.abstractmethod
    def open(self) -> None:
        """Install the library's schema on the fresh database and connect."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect. The target itself is dropped by ``targets.fresh``."""

    @abc.abstractmethod
    def enqueue_each(self, first: int, count: int) -> None:
        """Enqueue jobs ``first .. first+count-1`` one call (one transaction) each."""

    @abc.abstractmethod
    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        """Enqueue the same jobs ``batch`` per call with the library's bulk API."""

    @abc.abstractmethod
    def done_count(self) -> int:
        """Finished jobs, by the library's own record in the database."""

    @abc.abstractmethod
    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        """The command line of one worker process."""

    def worker_commands(self, spec: WorkerSpec, processes: int) -> list[list[str]]:
        """One command line per OS process; a library with its own multi-process option
        may return a single command that starts them all."""
        return [self.worker_argv(spec) for _ in range(processes)]

    def worker_env(self, spec: WorkerSpec) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_project_root(),
                                                          env.get("PYTHONPATH")]))
        if spec.starts_path:
            env[STARTS_ENV] = spec.starts_path
        if spec.stamps_prefix:
            env[STAMPS_ENV] = spec.stamps_prefix
            env[STAMPS_GOAL_ENV] = str(spec.stamps_goal)
        return env

    def __enter__(self) -> System:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# --- worker processes -------------------------------------------------------------------------


class Workers:
    """Worker processes of one scenario; their stderr goes to a temporary log file."""

    def __init__(self, system: System, spec: WorkerSpec, processes: int,
                 wrap: Sequence[str] = ()):
        self.system = system
        self.spec = spec
        self._logs: list[tuple[subprocess.Popen[bytes], str]] = []
        for argv in system.worker_commands(spec, processes):
            fd, log = tempfile.mkstemp(prefix="leaseq-bench-worker-", suffix=".log")
            with os.fdopen(fd, "wb") as out:
                proc = subprocess.Popen([*wrap, *argv],
                                        env=system.worker_env(spec), stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            self._logs.append((proc, log))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._logs]

    def all_exited(self) -> bool:
        """Whether every worker process has ended (burst workers end when they find nothing
        left; a drain that has not reached its goal by then never will)."""
        return all(proc.poll() is not None for proc, _ in self._logs)

    def check(self) -> None:
        """Raise with the worker's output when one died with an error."""
        for proc, log in self._logs:
            code = proc.poll()
            if code not in (None, 0):
                raise WorkerFailed(self.system.name, code, _tail(log))

    def stop(self, timeout_s: float = 30.0, now: bool = False) -> None:
        """Burst workers are waited for (unless ``now``); others get SIGINT, then SIGTERM,
        then SIGKILL."""
        wait = timeout_s if self.system.has_burst and not now else 0
        deadline = time.monotonic() + wait
        for proc, _ in self._logs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.05))
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            alive = [p for p, _ in self._logs if p.poll() is None]
            for proc in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            for proc in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)

    def close(self) -> None:
        self.stop(now=True)
        for _, log in self._logs:
            with contextlib.suppress(FileNotFoundError):
                os.remove(log)

    def output(self) -> str:
        return "\n".join(_tail(log) for _, log in self._logs)


@contextlib.contextmanager
def running(system: System, spec: WorkerSpec, processes: int,
            wrap: Sequence[str] = ()) -> Iterator[Workers]:
    workers = Workers(system, spec, processes, wrap)
    try:
        yield workers
    finally:
        workers.close()


class WorkerFailed(RuntimeError):
    def __init__(self, name: str, code: int, output: str):
        super().__init__(f"{name} worker exited with code {code}:\n{output}")


def _tail(path: str, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-limit:].decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc); 0 when gone."""
    total = 0
    for each in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{each}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def record_start(i: int) -> None:
    """What every benchmark handler does: note its start time (wall clock) when asked to.

    ``STARTS_ENV``: the file is opened per call in append mode: one ``write`` of a short line
    is atomic, so threads and processes can share it; the open costs microseconds against a
    millisecond budget and happens only in the latency scenario. ``STAMPS_ENV``: kept in
    memory (``list.append`` is atomic), written when the process exits (backlog scenario).
    """
    path = os.environ.get(STARTS_ENV)
    if path:
        now = time.time()
        with open(path, "a") as f:
            f.write(f"{i} {now:.6f}\n")
    if _STAMPS is not None:
        _STAMPS.append(f"{i} {time.time():.6f}\n")
        if len(_STAMPS) == _STAMPS_GOAL:
            open(f"{os.environ[STAMPS_ENV]}.reached", "a").close()


def _stamps_in_memory() -> list[str] | None:
    prefix = os.environ.get(STAMPS_ENV)
    if not prefix:
        return None
    stamps: list[str] = []

    def write() -> None:
        with open(f"{prefix}.{os.getpid()}", "w") as f:
            f.writelines(stamps)

    atexit.register(write)
    return stamps


_STAMPS = _stamps_in_memory()
_STAMPS_GOAL = int(os.environ.get(STAMPS_GOAL_ENV) or 0)


def read_stamps(prefix: str) -> list[float]:
    """Every worker process's start times (the first of each job), sorted; the files go."""
    starts: dict[int, float] = {}
    for path in glob.glob(f"{glob.escape(prefix)}.*"):
        if not path.endswith(".reached"):
            for i, at in read_starts(path).items():
                starts[i] = min(at, starts.get(i, at))
        os.remove(path)
    return sorted(starts.values())


def read_starts(path: str) -> dict[int, float]:
    starts: dict[int, float] = {}
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            i, at = line.split()
            starts.setdefault(int(i), float(at))  # a redelivery keeps the first start
    return starts

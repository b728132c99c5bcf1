"""leaseq itself: enqueue through the ``Queue`` API, drain with ``leaseq worker``."""

from __future__ import annotations

import importlib.util
import sys

import leaseq
from bench.systems import System, WorkerSpec, python_argv
from bench.targets import Target
from bench.tasks import KEY_LIMIT, KEYS, PRIORITIES, QUEUE, TASK, WIDE_KEYS

WORKER_MODES = ("auto", "leaseq", "queue-api")
#: What the jobs carry: nothing more (``plain``), a priority each (``priorities``, 10 levels),
#: or a concurrency key each on a queue with a key limit (``keys``: 10 keys, key_limit 4;
#: ``wide-keys``: 100 keys).
VARIANTS = ("plain", "priorities", "keys", "wide-keys")
#: How many keys each keyed variant spreads its jobs over.
KEYS_OF = {"keys": KEYS, "wide-keys": WIDE_KEYS}
#: How the jobs are named: ``counter`` (``j0``, ``j1``, …: enqueue order, though not the ids'
#: text order) or ``random`` (eight hex digits in no order, as UUIDs would be; a permutation
#: of the counter, so every id is still unique).
ID_SHAPES = ("counter", "random")


def job_id(i: int, shape: str = "counter") -> str:
    if shape == "random":
        return f"j{(i * 2654435761) % 2**32:08x}"  # Knuth's multiplicative hash: a bijection
    return f"j{i}"


def real_worker_available() -> bool:
    return (importlib.util.find_spec("leaseq.worker") is not None
            and importlib.util.find_spec("leaseq.supervisor") is not None)


def _cli_available() -> bool:
    return importlib.util.find_spec("leaseq.cli") is not None


class LeaseqSystem(System):
    name = "leaseq"
    kinds = ("sqlite", "postgresql", "mongodb")
    done_means = "status done (store's counts())"

    def __init__(self, target: Target, worker: str = "auto", variant: str = "plain",
                 ids: str = "counter"):
        super().__init__(target)
        if worker not in WORKER_MODES:
            raise ValueError(f"worker must be one of {', '.join(WORKER_MODES)}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}")
        if ids not in ID_SHAPES:
            raise ValueError(f"ids must be one of {', '.join(ID_SHAPES)}")
        self.variant = variant
        self.ids = ids
        if worker == "auto":
            worker = "leaseq" if real_worker_available() else "queue-api"
        self.worker = worker
        self.store: leaseq.Store | None = None

    def open(self) -> None:
        self.store = leaseq.connect(self.target.url)
        limits = {"key_limit": KEY_LIMIT} if self.variant in KEYS_OF else {}
        self._queue = self.store.queue(QUEUE, **limits)

    def close(self) -> None:
        if self.store is not None:
            try:
                self.store.drop()
            except NotImplementedError:
                pass
            self.store.close()
            self.store = None

    def _extra(self, i: int) -> dict[str, object]:
        if self.variant == "priorities":
            return {"priority": i % PRIORITIES}
        if self.variant in KEYS_OF:
            return {"concurrency_key": f"key-{i % KEYS_OF[self.variant]}"}
        return {}

    def enqueue_each(self, first: int, count: int) -> None:
        enqueue = self._queue.enqueue
        for i in range(first, first + count):
            enqueue(job_id(i, self.ids), {"i": i}, task=TASK, **self._extra(i))  # type: ignore[arg-type]

    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        spec = self._queue.spec
        for start in range(first, first + count, batch):
            stop = min(start + batch, first + count)
            self._queue.enqueue_many([
                spec(job_id(i, self.ids), {"i": i}, task=TASK, **self._extra(i))  # type: ignore[arg-type]
                for i in range(start, stop)])

    def done_count(self) -> int:
        return self._queue.counts().get("done", 0)

    def worker_commands(self, spec: WorkerSpec, processes: int) -> list[list[str]]:
        if self.worker == "queue-api":
            return super().worker_commands(spec, processes)
        options = ["--processes", str(processes)]
        if spec.concurrency is not None:
            options += ["--concurrency", str(spec.concurrency)]
        if _cli_available():
            argv = [sys.executable, "-c", "import sys; from leaseq.cli import main; main()",
                    "worker", self.app_ref, "--url", self.target.url,
                    "--log-level", "warning", *options]
        else:  # the same worker through its Python API
            argv = python_argv("bench.leaseq_worker", self.target.url, "--app", self.app_ref,
                               *options)
        return [[*argv, "--burst"] if spec.burst else argv]

    @property
    def app_ref(self) -> str:
        return "bench.tasks:keyed_app" if self.variant in KEYS_OF else "bench.tasks:app"

    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        argv = python_argv("bench.queue_worker", self.target.url,
                           "--concurrency", str(spec.slots))
        if self.variant in KEYS_OF:
            argv += ["--key-limit", str(KEY_LIMIT)]
        return [*argv, "--burst"] if spec.burst else argv

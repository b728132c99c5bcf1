"""Helpers of the RabbitMQ integration tests: the per-test world (SQLite file, effects file,
processes), waiting, and a printable journal story."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import leaseq

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
PROCS = Path(__file__).with_name("procs.py")
def base_url() -> str:
    return os.environ.get("LEASEQ_TEST_AMQP_URL", DEFAULT_AMQP_URL)


def reachable(url: str) -> str | None:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            pass
    except OSError as exc:
        return f"RabbitMQ at {parts.hostname}:{parts.port or 5672} is unreachable ({exc})"
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not on PATH (needed to make a vhost per test)"
    return None


def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout


@dataclass
class Harness:
    """One test's world: its store, the effects file, and the processes it started."""

    folder: Path
    amqp_url: str
    store_url: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    _store: leaseq.Store | None = None

    @property
    def effects_file(self) -> Path:
        return self.folder / "effects.txt"

    def store(self) -> leaseq.Store:
        """The test's own handle on the store (one, reused; closed by ``close``)."""
        if self._store is None:
            self._store = leaseq.connect(self.store_url)
        return self._store

    def close(self) -> None:
        self.stop_all()
        if self._store is not None:
            self._store.close()

    def queue(self) -> leaseq.Queue:
        return self.store().queue("jobs", max_attempts=3)

    def start(self, role: str, *extra: str, **env: str) -> subprocess.Popen:
        log = open(self.folder / f"{role}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        environ = {**os.environ, "LEASEQ_TEST_EFFECTS": str(self.effects_file), **env}
        proc = subprocess.Popen(
            [sys.executable, str(PROCS), role, "--url", self.store_url,
             "--amqp-url", self.amqp_url, *extra],
            env=environ, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_cli_dispatcher(self, queues: tuple[str, ...] = ("jobs",)) -> subprocess.Popen:
        """The real ``leaseq dispatch`` command (through the delivery CLI group), with a
        ``--queue`` for each of ``queues`` (none: every queue of the store)."""
        log = open(self.folder / f"cli-dispatch-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "leaseq.delivery.cli", "dispatch", "--url",
             self.store_url, "--amqp-url", self.amqp_url,
             *(arg for name in queues for arg in ("--queue", name)),
             "--poll-interval-s", "0.2", "-v"],
            stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def effects(self) -> Counter[str]:
        if not self.effects_file.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.effects_file.read_text().splitlines())

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.folder.glob("*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(what: str, check: Callable[[], bool], timeout_s: float,
             harness: Harness | None = None) -> None:
    """Poll ``check`` until true; fail with the processes' logs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    detail = harness.logs() if harness else ""
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{detail}")


def story(queue: leaseq.Queue, job_id: str) -> list[str]:
    """The job's journal as printable lines."""
    lines = []
    for e in queue.journal(job_id):
        data = json.dumps(dict(e.data), sort_keys=True) if e.data else ""
        lines.append(f"{e.at:%H:%M:%S.%f} {e.event:<15} attempt={e.attempt} "
                     f"worker={(e.worker_id or '-')[-14:]} {e.reason or ''} {data}".rstrip())
    return lines

"""``leaseq demo`` and ``leaseq metrics`` as real processes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import leaseq

LEASEQ = [sys.executable, "-m", "leaseq.cli"]


def test_demo_json_ends_with_nothing_lost_and_no_duplicate_effects() -> None:
    # When the demo runs with fewer jobs
    done = subprocess.run([*LEASEQ, "demo", "--json", "--jobs", "300"], capture_output=True,
                          text=True, timeout=120)
    # Then it exits 0 and its summary adds up
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    for key in ("done", "quarantined", "reclaimed", "lost", "duplicate_effects", "elapsed_s"):
        assert key in summary
    assert (summary["lost"], summary["duplicate_effects"]) == (0, 0)
    assert summary["done"] + summary["quarantined"] == summary["jobs"]
    assert summary["quarantined_by_reason"]["invalid"] == 3  # jobs for a renamed task
    assert set(summary["replay"]) == {"unchanged"}  # the replayed batch created nothing
    assert summary["workers_started"] == 3  # two, and the replacement of the killed one
    assert summary["failed_checks"] == []  # nor done without effect, nor ended unexpectedly


def test_demo_kills_a_worker_holding_a_job_even_when_the_run_is_tiny() -> None:
    # Given a run so small that the pipeline can end between two looks at the store
    done = subprocess.run([*LEASEQ, "demo", "--json", "--jobs", "20"], capture_output=True,
                          text=True, timeout=120)
    # Then the crash still lands while a worker holds a job, and the replacement starts
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["workers_started"] == 3
    assert summary["killed_worker"]["held"] >= 1
    assert summary["reclaimed"] >= 1  # the held job's lease ran out and it ran again
    assert (summary["lost"], summary["duplicate_effects"]) == (0, 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_metrics_command_serves_queue_gauges(tmp_path: Path) -> None:
    # Given a queue with one ready job and one delayed
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with leaseq.connect(url) as store:
        store.queue("images").enqueue("now", {})
        store.queue("images").enqueue("later", {}, delay_s=3600)
    port = free_port()
    process = subprocess.Popen([*LEASEQ, "metrics", "--port", str(port), "--addr", "127.0.0.1",
                                "--url", url], stderr=subprocess.PIPE, text=True)
    try:
        # When Prometheus scrapes it
        families = {f.name: f for f in text_string_to_metric_families(scrape(port))}
        # Then it sees the real work only as ready
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.values() for s in f.samples}
        assert samples[("leaseq_jobs", (("queue", "images"), ("status", "pending")))] == 2
        assert samples[("leaseq_ready_jobs", (("queue", "images"),))] == 1
        assert ("leaseq_oldest_pending_age_seconds", (("queue", "images"),)) in samples
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()  # type: ignore[union-attr]

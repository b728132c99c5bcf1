"""Scenario 5, the database goes away mid-run.

PostgreSQL: a throwaway cluster (``initdb`` + ``pg_ctl`` in a temporary folder, on its own port;
never the shared server) is restarted while worker processes claim and complete → 0 lost,
every job done exactly once. SQLite: a worker is SIGKILLed while it writes, several times →
``PRAGMA integrity_check`` says ok, 0 lost."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
import time

from leaseq.testing.chaos import Run, Skip, all_terminal, free_port, settle, wait_until


def run(r: Run) -> None:
    if r.store_kind == "postgres":
        _postgres(r)
    else:
        _sqlite(r)


def _enqueue(r: Run, q, n: int, sleep_s: float) -> list[str]:  # type: ignore[no-untyped-def]
    ids = [f"restart-{i:05d}" for i in range(n)]
    q.enqueue_many([q.spec(i, {"n": k, "sleep_s": sleep_s}, task="work", max_attempts=10)
                    for k, i in enumerate(ids)])
    return ids


def _sqlite(r: Run) -> None:
    n = r.size(600, 6000)
    store = r.open()
    q = store.queue("chaos")
    ids = _enqueue(r, q, n, 0.0)  # no work: the workers do little but write
    ledger = r.ledger()
    workers = [r.worker(f"w{k}", concurrency=8).start() for k in range(2)]
    kills = 0
    for share in (0.2, 0.4, 0.6):
        wait_until(lambda s=share: q.counts().get("done", 0) >= n * s, 60, 0.01)
        victim = workers[kills % 2]
        victim.kill()
        kills += 1
        victim.start()
    finished = wait_until(all_terminal(q, ids), r.size(90, 600), 0.2)
    for w in workers:
        w.stop()
    r.check("all jobs finished", finished, str(q.counts()))
    path = r.url[len("sqlite:///"):]
    with sqlite3.connect(path) as conn:
        integrity = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    r.log("integrity", result=integrity, kills=kills)
    r.check("PRAGMA integrity_check → ok", integrity == ["ok"], str(integrity[:5]))
    settle(r, q, ids, ledger, reruns_allowed=True)


def _postgres(r: Run) -> None:
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            raise Skip(f"{tool} is not on PATH: cannot start a throwaway PostgreSQL cluster")
    folder = tempfile.mkdtemp(prefix="leaseq-chaos-pg-")
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
        shutil.chown(folder, "postgres", "postgres")
    port = free_port()
    data, log = os.path.join(folder, "data"), os.path.join(folder, "log")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"

    def pg_ctl(*args: str) -> None:
        _as_owner(["pg_ctl", "-D", data, "-w", "-t", "60", "-l", log, *args])

    try:
        _as_owner(["initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--no-sync"])
        pg_ctl("start", "-o", options)
        r.on_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        r.on_cleanup(lambda: pg_ctl("stop", "-m", "immediate"))
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise Skip(f"cannot start a throwaway PostgreSQL cluster: {exc}") from None
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres?schema=chaos&reconnect_s=60"
    n = r.size(400, 4000)
    store = r.open(url)
    q = store.queue("chaos")
    ids = _enqueue(r, q, n, 0.01)
    ledger = r.ledger()
    workers = [r.worker(f"w{k}", concurrency=4, url=url).start() for k in range(2)]
    wait_until(lambda: q.counts().get("done", 0) >= n // 4, 60, 0.02)
    started = time.monotonic()
    pg_ctl("restart", "-m", "fast", "-o", options)
    r.log("restarted", seconds=time.monotonic() - started)
    finished = wait_until(all_terminal(q, ids), r.size(120, 600), 0.2)
    for w in workers:
        w.stop()
    r.check("all jobs finished after the restart", finished, str(q.counts()))
    alive = [w.name for w in workers if w.proc is not None and w.proc.returncode not in (0,)]
    r.check("the workers rode out the restart (clean exit)", not alive, str(alive))
    settle(r, q, ids, ledger, reruns_allowed=True)


def _as_owner(command: list[str]) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=120)

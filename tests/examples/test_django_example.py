"""examples/django_project as its README runs it: migrate, runserver on a loopback port,
orders placed over HTTP, ``leaseq_worker --burst``; a failing order leaves no job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="httpx is not installed")
pytest.importorskip("django", reason="leaseq[django] is not installed")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_django_example_from_its_readme(tmp_path: Path) -> None:
    env = {**os.environ, "SHOP_DB": str(tmp_path / "shop.db")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    _manage(env, "migrate", "--noinput")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                               "--noreload"], cwd=EXAMPLE, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            _wait_for(client, server)
            placed = client.post("/orders/", json={"email": "a@example.com"})
            assert placed.status_code == 202, placed.text
            from_async = client.post("/orders/async/", json={"email": "c@example.com"})
            assert from_async.status_code == 202, from_async.text
            failed = client.post("/orders/", json={"email": "b@example.com", "fail": 1})
            assert failed.status_code == 402
            order = placed.json()["order_id"]
            assert client.get(f"/orders/{order}/").json()["job_status"] == "pending"
            _manage(env, "leaseq_worker", "--burst", "--grace-s", "5")
            for placed_order in (order, from_async.json()["order_id"]):
                status = client.get(f"/orders/{placed_order}/").json()
                assert status["confirmed"] is True and status["job_status"] == "done"
            # the failed order rolled back with its job: no order 3 row, no confirm-3 job
            out = _manage(env, "shell", "-c", "from shop.models import Order; "
                          "from shop.jobs import app; q = app.queue('orders'); "
                          "print(Order.objects.count(), q.counts())")
            assert out.split()[0] == "2" and "'done': 2" in out and "pending" not in out
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=20)


def _wait_for(client: httpx.Client, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get("/orders/0/")
            return
        except httpx.TransportError:
            assert server.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.1)

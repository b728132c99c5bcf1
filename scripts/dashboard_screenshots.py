"""Screenshots of the dashboard's main pages for docs/dashboard.md (never run by the tests, so a
test run never changes docs/):

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/img]

Seeds a small demo store in a temporary folder, serves the dashboard on a free loopback port,
and drives Debian's Chromium (``apt-get install chromium``; never a downloaded browser) through
Playwright to save one PNG per page.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time

import uvicorn
from playwright.sync_api import sync_playwright

import leaseq
from leaseq.dashboard import BasicAuth, create_app
from leaseq.stores.base import Store

CHROMIUM = os.environ.get("LEASEQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = {
    "overview": "/",
    "jobs": "/jobs?queue=mail&status=failed",
    "job": "/job/mail/mail-0007",
    "quarantine": "/quarantine",
    "schedules": "/schedules",
    "workers": "/workers",
    "health": "/health",
}


def seed(store: Store) -> None:
    """A mail queue with every state, an export queue with a backlog held back by a key limit,
    two workers."""
    worker = "web-1:4242:a1b2c3d4"
    mail = store.queue("mail")
    for i in range(24):
        mail.enqueue(f"mail-{i:04d}", {"to": f"user{i}@example.com", "template": "welcome",
                                       "api_key": "sk_live_51Hxxxxxxxxxxxxxxxxxxxxxxxx"},
                     task="send_welcome")
    for i, job in enumerate(mail.claim(worker, limit=16, lease_s=600)):
        if i % 4 == 3:
            mail.fail(job, "SMTP 550 5.1.1 mailbox unavailable")
        elif i % 5 == 4:
            mail.fail(job, "ValueError: template 'welcome' has no field 'name'", "invalid")
        else:
            mail.complete(job, {"sent": True})
    export = store.queue("export", key_limit=1)  # one export per account at a time
    export.enqueue_many([export.spec(f"export-{i:04d}", {"report": "monthly", "account": i},
                                     task="build_report", concurrency_key=f"account:{i % 4}")
                         for i in range(40)])
    export.claim(worker, limit=3, lease_s=600)
    store.register_worker(worker, ["mail", "export"], 3)
    store.register_worker("web-2:4243:e5f6a7b8", ["mail"], 0)
    store.register_schedule("nightly-report", "export",
                            '{"cron":"0 2 * * *","task":"build_report","timezone":"Europe/Kyiv"}')
    store.register_schedule("cleanup", "mail", '{"every_s":900,"task":"purge_bounces"}')
    store.pause_schedule("cleanup", True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/dashboard_screenshots.py")
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        store = leaseq.connect(f"sqlite:///{folder}/demo.db")
        seed(store)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        app = create_app(store, auth=BasicAuth({"admin": "demo"}), permissions="all")
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", timeout_graceful_shutdown=1))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        try:
            shoot(f"http://127.0.0.1:{port}", args.out)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            store.close()


def shoot(base: str, out: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 720},
                                      http_credentials={"username": "admin", "password": "demo"})
        page = context.new_page()
        for name, path in PAGES.items():
            page.goto(base + path)
            path_out = os.path.join(out, f"dashboard-{name}.png")
            page.screenshot(path=path_out, full_page=True)
            print(path_out)
        context.close()
        browser.close()


if __name__ == "__main__":
    main()

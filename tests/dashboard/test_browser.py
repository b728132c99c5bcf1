"""The dashboard in a real browser: Debian's Chromium driven by Playwright (never a downloaded
browser). Skipped, with the reason, where either cannot be had; ``scripts/test`` installs both.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dashboard_data import XSS

from leaseq.dashboard import BasicAuth, LoginToken, create_app
from leaseq.stores.base import Store

CHROMIUM = os.environ.get("LEASEQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """The app on a real port, in a thread, for as long as the test runs."""

    def __init__(self, app: Any):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def roles(user: str) -> str:
    return {"admin": "all", "viewer": "read_only"}.get(user, "forbidden")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        except sync_api.Error as exc:
            pytest.skip(f"Chromium at {CHROMIUM} does not start: {str(exc).splitlines()[0]}")
        yield browser
        browser.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The shared browser; every context a test opened is closed before its server stops
    (an open event stream would hold the server's shutdown)."""
    opened: list[Any] = []
    real = chromium.new_context

    class Tracking:
        def new_context(self, **options: Any) -> Any:
            context = real(**options)
            opened.append(context)
            return context

    yield Tracking()
    for context in opened:
        context.close()


@pytest.fixture
def served(store: Store) -> Iterator[Served]:
    app = create_app(store, auth=BasicAuth({"admin": "pw", "viewer": "pw"}),
                     permissions=roles, sse_every_s=0.2)
    with Served(app) as served:
        yield served


def page_as(browser: Any, user: str) -> Any:
    context = browser.new_context(http_credentials={"username": user, "password": "pw"})
    context.set_default_timeout(10_000)
    return context.new_page()


def test_login_is_required_and_the_one_time_url_signs_in(chromium: Any, store: Store) -> None:
    with Served(create_app(store, auth=LoginToken("one-time-t0ken"), permissions="all")) as s:
        first, second = chromium.new_context(), chromium.new_context()
        try:
            page = first.new_page()
            assert page.goto(s.url + "/").status == 401
            assert page.goto(s.url + "/login?token=one-time-t0ken").status == 200
            assert page.locator("#overview tr[data-queue=mail]").count() == 1
            # The token is spent: another browser cannot use it again
            other = second.new_page()
            assert other.goto(s.url + "/login?token=one-time-t0ken").status == 401
        finally:
            first.close()
            second.close()


def test_filter_by_status_and_task_kept_in_the_url(browser: Any, served: Served) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/jobs?queue=mail")
    page.select_option("select[name=status]", "pending")
    page.fill("input[name=task]", "send")
    page.click("#apply")
    page.wait_for_url("**status=pending**")
    assert "task=send" in page.url
    assert page.locator("#jobs tr.job").count() == 3
    assert set(page.locator("#jobs td.status").all_inner_texts()) == {"pending"}


def test_open_a_jobs_timeline_then_requeue_it(browser: Any, served: Served,
                                              store: Store) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/jobs?queue=mail&status=failed")
    page.click("a.job-link:text-is('f-2')")
    events = page.locator("#timeline tr.event td:nth-child(2)").all_inner_texts()
    assert events == ["enqueued", "claimed", "quarantined"]
    page.click("#requeue")
    assert "1 job(s) changed" in page.locator("#done").inner_text()
    assert store.get("mail", "f-2").status == "pending"  # type: ignore[union-attr]
    assert store.journal("mail", "f-2")[-1].reason == "by admin"


def test_bulk_cancel_every_match_after_seeing_the_count(browser: Any, served: Served,
                                                        store: Store) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/jobs?queue=mail&status=pending&task=send")
    page.click("button.bulk-cancel")
    assert "3 job(s)" in page.locator("#count").inner_text()
    store.queue("mail").enqueue("late", {}, task="send")  # matches only after the count
    page.click("#confirm")
    assert "3 job(s) changed" in page.locator("#done").inner_text()
    assert store.counts("mail")["cancelled"] == 3
    assert store.get("mail", "late").status == "pending"  # type: ignore[union-attr]


def _post(page: Any, token: str | None) -> int:
    return page.evaluate("""async (token) => {
        const body = new URLSearchParams({queue: "mail", action: "requeue", job_id: "f-1"});
        if (token !== null) body.set("csrf_token", token);
        const r = await fetch("/action", {method: "POST", body});
        return r.status;
    }""", token)


def test_read_only_sees_no_action_and_a_forged_post_gets_403(browser: Any, served: Served,
                                                             store: Store) -> None:
    page = page_as(browser, "viewer")
    page.goto(served.url + "/jobs?queue=mail")
    assert page.locator("button[name=action]").count() == 0
    page.goto(served.url + "/job/mail/f-1")
    assert page.locator("form button, textarea").count() == 0
    token = page.locator("meta[name=csrf-token]").get_attribute("content")
    assert _post(page, token) == 403  # a valid token, but not permitted
    assert store.get("mail", "f-1").status == "failed"  # type: ignore[union-attr]


def test_a_post_without_the_csrf_token_gets_403(browser: Any, served: Served,
                                                store: Store) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/jobs?queue=mail")
    assert _post(page, None) == 403
    assert store.get("mail", "f-1").status == "failed"  # type: ignore[union-attr]
    token = page.locator("meta[name=csrf-token]").get_attribute("content")
    assert _post(page, token) == 200  # the same request with the token goes through


def test_xss_probes_in_job_data_stay_text(browser: Any, served: Served) -> None:
    page = page_as(browser, "admin")
    for path in ["/jobs?queue=xss", "/quarantine",
                 *[f"/job/xss/{i}" for i in range(len(XSS))]]:
        if path.startswith("/job/xss/"):
            page.goto(served.url + "/jobs?queue=xss")
            page.locator("a.job-link").nth(int(path.rsplit("/", 1)[1])).click()
        else:
            page.goto(served.url + path)
        dom = page.evaluate("""() => ({
            fired: window.__xss === 1,
            scripts: [...document.scripts].map(s => s.getAttribute("src")),
            injected: document.querySelectorAll("img, svg, iframe, object").length,
            handlers: [...document.querySelectorAll("*")].flatMap(
                e => [...e.attributes].filter(a => a.name.startsWith("on")).map(a => a.name)),
            jsLinks: [...document.querySelectorAll("a")].filter(
                a => a.protocol === "javascript:").length,
        })""")
        assert dom == {"fired": False, "scripts": ["/static/dashboard.js"], "injected": 0,
                       "handlers": [], "jsLinks": 0}, path
    # And the probes are shown as the text they are
    page.goto(served.url + "/jobs?queue=xss")
    assert set(page.locator("#jobs td.task").all_inner_texts()) == set(XSS)


def test_the_overview_updates_live(browser: Any, served: Served, store: Store) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/")
    cell = page.locator("tr[data-queue=mail] td[data-field=pending]")
    assert cell.inner_text() == "3"
    store.queue("mail").enqueue("new-1", {})
    page.wait_for_function(
        "() => document.querySelector('tr[data-queue=mail] td[data-field=pending]')"
        ".textContent === '4'")
    assert page.locator("#live-status").inner_text() == "live"


def test_live_updates_pause_while_the_tab_is_hidden(browser: Any, served: Served) -> None:
    page = page_as(browser, "admin")
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if r.url.endswith("/events") else None)
    page.goto(served.url + "/")
    page.wait_for_function("() => document.getElementById('live-status').textContent === 'live'")
    # When the tab is hidden, the stream is closed; when shown again, a new one opens
    page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {value: true, configurable: true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    assert page.locator("#live-status").inner_text() == "paused"
    opened = len(streams)
    page.evaluate("""() => {
        Object.defineProperty(document, "hidden", {value: false, configurable: true});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    page.wait_for_function("() => document.getElementById('live-status').textContent === 'live'")
    assert len(streams) == opened + 1


def test_pause_and_resume_a_schedule(browser: Any, served: Served, store: Store) -> None:
    page = page_as(browser, "admin")
    page.goto(served.url + "/schedules")
    row = page.locator("tr.schedule[data-name=nightly-digest]")
    assert row.locator("td.state").inner_text() == "active"
    row.locator("button.pause").click()
    assert row.locator("td.state").inner_text() == "paused"
    assert store.schedule_state("nightly-digest").paused  # type: ignore[union-attr]
    row.locator("button.resume").click()
    assert row.locator("td.state").inner_text() == "active"


def test_the_overview_polls_when_the_event_stream_cannot_be_had(
    browser: Any, served: Served, store: Store
) -> None:
    # Given a proxy that breaks the event stream
    page = page_as(browser, "admin")
    page.route("**/events", lambda route: route.abort())
    page.goto(served.url + "/")
    # Then the page falls back to polling, and still shows new work
    page.wait_for_function(
        "() => document.getElementById('live-status').textContent === 'live (polling)'")
    store.queue("mail").enqueue("new-2", {})
    page.wait_for_function(
        "() => document.querySelector('tr[data-queue=mail] td[data-field=pending]')"
        ".textContent === '4'")

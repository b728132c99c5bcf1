"""The overview's held-back columns: per queue, the ready jobs its key limits and its rate limit
keep from being claimed, on the page, in ``/api/stats`` and in the event stream; a queue
without limits shows "—" and costs no ``held_back`` read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from dashboard_data import W, basic
from starlette.testclient import TestClient

from leaseq.dashboard import BasicAuth, create_app
from leaseq.limits import ClaimLimits, HeldBack
from leaseq.stores.base import Store

ADMIN = basic("admin", "pw")
HELD = ["held_by_key", "held_by_rate"]


class Cells(HTMLParser):
    """The text of every ``td[data-field]`` of the overview, by queue then field."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._queue: str | None = None
        self._field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-queue"):
            self._queue = found["data-queue"]
            self.rows[self._queue] = {}
        elif tag == "td" and found.get("data-field") and self._queue is not None:
            self._field = found["data-field"]

    def handle_data(self, data: str) -> None:
        if self._queue is not None and self._field is not None:
            self.rows[self._queue][self._field] = data.strip()
            self._field = None


def overview_cells(client: TestClient) -> dict[str, dict[str, str]]:
    page = client.get("/", headers=ADMIN)
    assert page.status_code == 200
    parser = Cells()
    parser.feed(page.text)
    return parser.rows


@pytest.fixture
def held_back_calls(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues ``store.held_back`` was asked about, in order."""
    calls: list[str] = []
    real = store.held_back

    def counting(queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        calls.append(queue)
        return real(queue, limits)

    monkeypatch.setattr(store, "held_back", counting)
    return calls


@pytest.fixture
def client(store: Store) -> TestClient:
    return TestClient(create_app(store, auth=BasicAuth({"admin": "pw"}), sse_every_s=0.01))


def given_a_key_held_back(store: Store) -> None:
    """limited: key_limit 1, three jobs of one key, one of them processing."""
    q = store.queue("limited", key_limit=1)
    for i in range(3):
        q.enqueue(f"t-{i}", {}, concurrency_key="tenant-1")
    assert len(q.claim(W, limit=10)) == 1


def stats_of(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["queue"]: {field: row[field] for field in HELD} for row in rows}


def test_a_key_limited_queue_shows_its_held_back_jobs(
    client: TestClient, store: Store, held_back_calls: list[str]
) -> None:
    # Given a queue whose key runs its one job and has two more ready
    given_a_key_held_back(store)
    # When the overview is read, as a page, as JSON and as the event stream
    cells = overview_cells(client)
    api = stats_of(client.get("/api/stats", headers=ADMIN).json())
    with client.stream("GET", "/events", headers=ADMIN) as response:
        line = next(iter(response.iter_lines()))
    streamed = stats_of(json.loads(line.removeprefix("data: ")))
    # Then all three show the two jobs held back by the key, none by a rate
    assert {f: cells["limited"][f] for f in HELD} == {"held_by_key": "2", "held_by_rate": "0"}
    assert api["limited"] == streamed["limited"] == {"held_by_key": 2, "held_by_rate": 0}
    assert cells["limited"]["ready"] == "2"
    # And the held-back counts were read for the limited queue only
    assert set(held_back_calls) == {"limited"}


def test_a_rate_limited_queue_shows_jobs_held_by_the_rate(
    client: TestClient, store: Store
) -> None:
    # Given a queue limited to one claim a second, with three jobs, one just claimed
    q = store.queue("rated", rate_per_s=1)
    for i in range(3):
        q.enqueue(f"r-{i}", {})
    assert len(q.claim(W, limit=10)) == 1
    # Then of the two ready, one waits beyond the next second's one claim
    rated = stats_of(client.get("/api/stats", headers=ADMIN).json())["rated"]
    assert rated["held_by_key"] == 0 and rated["held_by_rate"] == 1


def test_queues_without_limits_show_a_dash_and_pay_no_held_back_read(
    client: TestClient, store: Store, held_back_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given queues that never ran a limited claim (mail, xss), each read counted
    lookups: list[dict[str, ClaimLimits]] = []
    real = store.limited_queues

    def counting() -> dict[str, ClaimLimits]:
        lookups.append(real())
        return lookups[-1]

    monkeypatch.setattr(store, "limited_queues", counting)
    # When the overview is read
    cells = overview_cells(client)
    api = stats_of(client.get("/api/stats", headers=ADMIN).json())
    # Then they show "—" on the page and null in the JSON, and held_back was never asked
    for queue in ("mail", "xss"):
        assert {f: cells[queue][f] for f in HELD} == dict.fromkeys(HELD, "—")
        assert api[queue] == dict.fromkeys(HELD)
    assert held_back_calls == []
    # And which queues have limits was one read for the snapshot, not one per queue
    assert len(lookups) == 1


@pytest.fixture
def live_page(store: Store) -> Iterator[tuple[Any, str]]:
    """A browser page in Debian's Chromium and the overview's URL (skipped, with the reason,
    where it cannot run)."""
    browser_tests = pytest.importorskip("test_browser")
    app = create_app(store, auth=BasicAuth({"admin": "pw"}), sse_every_s=0.2)
    with browser_tests.sync_api.sync_playwright() as p, browser_tests.Served(app) as served:
        browser = p.chromium.launch(executable_path=browser_tests.CHROMIUM,
                                    args=browser_tests.ARGS)
        context = browser.new_context(http_credentials={"username": "admin", "password": "pw"})
        context.set_default_timeout(10_000)
        yield context.new_page(), served.url + "/"
        context.close()  # before the server stops: an open event stream holds its shutdown
        browser.close()


def test_the_live_update_writes_the_held_back_columns(
    live_page: tuple[Any, str], store: Store
) -> None:
    page, url = live_page
    # Given the overview open on a key holding two jobs back
    given_a_key_held_back(store)
    page.goto(url)
    held = "document.querySelector('tr[data-queue=limited] td[data-field=held_by_key]')"
    assert page.evaluate(f"() => {held}.textContent") == "2"
    # When the running job finishes, freeing the key's slot for one of the two
    q = store.queue("limited", key_limit=1)
    running = q.list_jobs(status="processing")[0]
    q.complete(running, None)
    # Then the event stream brings the new count into the page
    page.wait_for_function(f"() => {held}.textContent === '1'")
    # And a queue without limits still reads "—" after the live update, not "null" or "0"
    mail = page.locator("tr[data-queue=mail]")
    assert mail.locator("td[data-field=held_by_key]").inner_text() == "—"
    assert mail.locator("td[data-field=held_by_rate]").inner_text() == "—"
    assert page.locator("#live-status").inner_text() == "live"

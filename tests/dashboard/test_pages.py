"""The dashboard's pages over HTTP, each read as a browser would build it: the quarantine
grouped by failure kind and the last line of the error, an action on a checkbox selection
acting on exactly the jobs selected, and the health page telling the doctor's findings."""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
from dashboard_data import W, basic
from starlette.testclient import TestClient

import leaseq
from leaseq.browse import BulkAction
from leaseq.dashboard import BasicAuth, create_app
from leaseq.job import Failure
from leaseq.journal import JournalEvent
from leaseq.stores.base import Store
from leaseq.stores.sqlite.store import SQLiteStore

ADMIN = basic("admin", "pw")


class Page(HTMLParser):
    """The parts of a page these tests read: each table's rows as the text of their cells,
    and each form's action with its inputs."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.forms: dict[str, tuple[str, list[dict[str, str | None]]]] = {}
        self._table: str | None = None
        self._form: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self._table = found.get("id") or ""
            self.tables[self._table] = []
        elif tag == "form":
            self._form = found.get("id") or ""
            self.forms[self._form] = (found.get("action") or "", [])
        elif tag == "input" and self._form is not None:
            self.forms[self._form][1].append(found)
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._table is not None and self._row:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "form":
            self._form = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture
def empty_store(tmp_path) -> Iterator[Store]:
    store = leaseq.connect(f"sqlite:///{tmp_path}/quarantine.db")
    yield store
    store.close()


def admin_client(store: Store) -> TestClient:
    return TestClient(create_app(store, auth=BasicAuth({"admin": "pw"}), permissions="all"))


def given_failed(store: Store, job_id: str, error: str, failure: Failure) -> None:
    q = store.queue("billing")
    q.enqueue(job_id, {"n": job_id}, task="charge")
    q.fail(q.claim_one(job_id, W, lease_s=600), error, failure)  # type: ignore[arg-type]


def test_the_quarantine_groups_failed_jobs_by_kind_and_last_error_line(
    empty_store: Store,
) -> None:
    # Given failed jobs with two errors and two failure kinds; the tracebacks above the
    # last line differ, and one error is met under both kinds
    for i in range(2):
        given_failed(empty_store, f"card-{i}", f"Traceback\n  line {i} in charge\n"
                     "ValueError: card declined", Failure.PERMANENT)
    for i in range(3):
        given_failed(empty_store, f"gw-{i}", f"Traceback\n  attempt {i}\n"
                     "TimeoutError: gateway timed out", Failure.EXHAUSTED)
    given_failed(empty_store, "card-late", "ValueError: card declined", Failure.EXHAUSTED)
    empty_store.queue("billing").enqueue("still-pending", {})
    # When the quarantine page is read
    response = admin_client(empty_store).get("/quarantine", headers=ADMIN)
    # Then each kind and last line is one group with its count, the largest first
    assert response.status_code == 200
    rows = Page(response.text).tables["quarantine"]
    assert rows[0] == ["billing", "exhausted", "TimeoutError: gateway timed out", "3"]
    assert sorted(rows[1:]) == [["billing", "exhausted", "ValueError: card declined", "1"],
                                ["billing", "permanent", "ValueError: card declined", "2"]]


def test_an_empty_quarantine_says_so(empty_store: Store) -> None:
    empty_store.queue("billing").enqueue("pending", {})
    page = admin_client(empty_store).get("/quarantine", headers=ADMIN).text
    assert Page(page).tables["quarantine"] == [["the quarantine is empty"]]


def selection_form(client: TestClient, url: str) -> tuple[str, dict[str, str], list[str]]:
    """The jobs page's selection form: where it posts, its hidden fields, its checkboxes."""
    action, inputs = Page(client.get(url, headers=ADMIN).text).forms["selection"]
    hidden = {str(i["name"]): str(i["value"]) for i in inputs if i.get("type") == "hidden"}
    boxes = [str(i["value"]) for i in inputs if i.get("type") == "checkbox"]
    return action, hidden, boxes


def test_an_action_on_a_selection_acts_on_exactly_the_selected_jobs(store: Store) -> None:
    # Given the pending jobs of mail, listed with a checkbox each
    client = admin_client(store)
    action, hidden, boxes = selection_form(client, "/jobs?queue=mail&status=pending")
    assert (action, hidden["queue"]) == ("/action", "mail")
    assert sorted(boxes) == ["p-0", "p-1", "p-2"]
    before = {job_id: len(store.journal("mail", job_id)) for job_id in boxes}
    # When the operator ticks two of them and cancels
    done = client.post(action, headers=ADMIN, data={
        **hidden, "action": BulkAction.CANCEL, "job_id": ["p-0", "p-2"]})
    # Then those two are cancelled, journaled with who did it, and the third is untouched
    assert done.status_code == 200 and "cancel: 2 job(s) changed" in done.text
    assert {j: store.get("mail", j).status for j in boxes} == {  # type: ignore[union-attr]
        "p-0": "cancelled", "p-1": "pending", "p-2": "cancelled"}
    for job_id in ("p-0", "p-2"):
        last = store.journal("mail", job_id)[-1]
        assert (last.event, last.reason) == (JournalEvent.CANCELLED, "by admin")
    assert len(store.journal("mail", "p-1")) == before["p-1"]
    assert store.get("mail", "f-1").status == "failed"  # type: ignore[union-attr]


def test_a_selection_leaves_alone_the_jobs_the_action_does_not_fit(store: Store) -> None:
    # Given a selection of a failed job and a pending one
    client = admin_client(store)
    action, hidden, _ = selection_form(client, "/jobs?queue=mail")
    # When the operator requeues both
    done = client.post(action, headers=ADMIN, data={
        **hidden, "action": BulkAction.REQUEUE, "job_id": ["f-1", "p-1"]})
    # Then only the failed one is requeued; the pending one is counted as left alone
    assert "requeue: 1 job(s) changed" in done.text and "1 left alone" in done.text
    assert store.get("mail", "f-1").status == "pending"  # type: ignore[union-attr]
    assert store.journal("mail", "f-1")[-1].reason == "by admin"
    assert store.journal("mail", "p-1")[-1].event == JournalEvent.ENQUEUED


def test_the_health_page_shows_the_doctors_findings_and_migrates_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job whose lease ran out 25 s ago with no sweeper to reclaim it
    store.queue("mail").claim(W, lease_s=5)
    store.time_offset_s = 30
    store.register_worker(W, ["mail"], 1)

    def no_migrations(self: SQLiteStore) -> int:
        raise AssertionError("the health page ran migrate()")

    monkeypatch.setattr(SQLiteStore, "migrate", no_migrations)
    # When the health page is read
    response = admin_client(store).get("/health", headers=ADMIN)
    # Then it tells the finding's symptom and action, as `leaseq doctor` would
    assert response.status_code == 200
    assert "1 job(s) hold a lease that ran out and was not reclaimed" in response.text
    assert "leaseq sweep --queue mail" in response.text
    assert 'id="healthy"' not in response.text


def test_the_health_page_of_a_healthy_store_says_so(empty_store: Store) -> None:
    q = empty_store.queue("mail")
    q.enqueue("ready-1", {})
    empty_store.register_worker(W, ["mail"], 0)
    page = admin_client(empty_store).get("/health", headers=ADMIN).text
    assert 'id="healthy"' in page and 'class="finding' not in page

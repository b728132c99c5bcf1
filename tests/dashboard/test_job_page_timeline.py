"""A job's page tells its journal as a timeline: each attempt with its worker, how long it ran
and how it ended, and how long the job waited for its first claim. The store's clock is moved
(``time_offset_s``) so the durations are known: each step puts it at a time from the test's
start, whatever real time passed (a loaded machine's 50 ms between two statements turned
12.0 s into 12.1 s)."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser

import pytest
from dashboard_data import XSS, basic
from starlette.testclient import TestClient

from leaseq.dashboard import BasicAuth, create_app
from leaseq.stores.base import Store
from leaseq.timeline import TAKEN_AGAIN

ADMIN = basic("admin", "pw")
W1, W2 = "host:1:aaaa0001", "host:2:bbbb0002"


class Cells(HTMLParser):
    """The text of each cell of one table, row by row, and the elements met inside it."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id, self.inside = table_id, False
        self.rows: list[list[str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.table_id
        elif self.inside:
            self.tags.append(tag)
            if tag == "tr":
                self.rows.append([])
            elif tag == "td":
                self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "table"

    def handle_data(self, data: str) -> None:
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data.strip()


def table(html: str, table_id: str) -> Cells:
    cells = Cells(table_id)
    cells.feed(html)
    cells.rows = [row for row in cells.rows if row]  # the header row has no td
    return cells


class StoreClock:
    """The store's clock, set ``at(s)`` seconds after this object was made. The steps carry
    a few hundredths of a second more than the durations they stand for, so that a duration
    floored to the second (or rounded to a tenth) never lands on the edge of a unit."""

    def __init__(self, store: Store) -> None:
        self.store, self.start = store, time.time()

    def at(self, seconds: float) -> None:
        self.store.time_offset_s = seconds - (time.time() - self.start)


@pytest.fixture
def client(store: Store) -> TestClient:
    return TestClient(create_app(store, auth=BasicAuth({"admin": "pw"}), permissions="all"))


def test_a_lease_lost_to_another_worker_shows_both_attempts_and_their_durations(
        client: TestClient, store: Store) -> None:
    # Given a job claimed 30 s after its enqueue, whose lease ran out; a second worker took it
    # at +200 s, the first worker heard at +205 s, and the second finished at +212 s
    q, clock = store.queue("mail"), StoreClock(store)
    q.enqueue("t-1", {}, task="send")
    clock.at(30.02)
    first = q.claim_one("t-1", W1, lease_s=60)
    clock.at(200.04)
    second = q.claim_one("t-1", W2, lease_s=60)
    assert first is not None and second is not None
    clock.at(205.05)
    assert q.heartbeat([first]) == ["t-1"]
    clock.at(212.06)
    q.complete(second, None)
    # When its page is read
    html = client.get("/job/mail/t-1", headers=ADMIN).text
    # Then each attempt names its worker, how long it ran and what ended it
    attempts = table(html, "attempts").rows
    assert [[row[0], row[1], row[3], row[4], row[5]] for row in attempts] == [
        ["1", W1, "2 min 50 s", "claimed", TAKEN_AGAIN],
        ["2", W2, "12.0 s", "result_saved", "done"]]
    # And the job's wait for its first claim is stated
    waited = re.search(r'<p id="waited">(.*?)</p>', html)
    assert waited and re.sub(r"<[^>]+>", "", waited[1]) == \
        "Waited 30.0 s from its enqueue to its first claim."
    # And the timeline puts each duration beside the row it was measured to
    events = [(row[1], row[5]) for row in table(html, "timeline").rows]
    assert events == [("enqueued", ""), ("claimed", "waited 30.0 s"),
                      ("claimed", "attempt 1 ran 2 min 50 s"), ("heartbeat_lost", ""),
                      ("result_saved", "attempt 2 ran 12.0 s")]


def test_an_attempt_still_running_shows_how_long_it_has_run(client: TestClient,
                                                            store: Store) -> None:
    # Given a job claimed and still held 95 s later
    q, clock = store.queue("mail"), StoreClock(store)
    q.enqueue("t-2", {}, task="send")
    clock.at(1)
    q.claim_one("t-2", W1, lease_s=600)
    clock.at(96.2)
    # When its page is read
    html = client.get("/job/mail/t-2", headers=ADMIN).text
    # Then the attempt is running for the time since its claim
    (attempt,) = table(html, "attempts").rows
    assert (attempt[3], attempt[4]) == ("running for 1 min 35 s", "still running")
    assert table(html, "timeline").rows[1][5].endswith("running for 1 min 35 s")


def test_a_job_never_claimed_shows_no_attempt_and_no_wait(client: TestClient) -> None:
    html = client.get("/job/mail/p-0", headers=ADMIN).text
    assert table(html, "attempts").rows == [] and 'id="waited"' not in html


@pytest.mark.parametrize("probe", XSS)
def test_a_worker_id_and_a_reason_in_the_attempts_are_shown_as_text(
        client: TestClient, store: Store, probe: str) -> None:
    # Given an attempt by a worker whose id is a probe, snoozed with the probe as its reason
    q = store.queue("mail")
    q.enqueue("t-3", {}, task="send")
    q.snooze(q.claim_one("t-3", probe, lease_s=60), 5, reason=probe)  # type: ignore[arg-type]
    # When its page is read
    cells = table(client.get("/job/mail/t-3", headers=ADMIN).text, "attempts")
    # Then the probe is the cells' text, and no element came of it
    (attempt,) = cells.rows
    assert (attempt[1], attempt[4], attempt[5]) == (probe, "snoozed", probe)
    assert set(cells.tags) <= {"thead", "tbody", "tr", "th", "td"}

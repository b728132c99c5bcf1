"""The dashboard given hostile input: job ids that are URL syntax, secrets in errors and journal
reasons, cursors and filters no page gave, forms with a field missing."""

from __future__ import annotations

import html
import re

import pytest
from dashboard_data import W, basic
from starlette.testclient import TestClient

from leaseq.dashboard import BasicAuth, create_app
from leaseq.dashboard.app import url_part
from leaseq.redact import Redactor
from leaseq.stores.base import Store

ADMIN = basic("admin", "pw")
VIEWER = basic("viewer", "pw")
#: Ids a URL would read as something else: a path, a query, a fragment, an escape.
URL_IDS = ["x/../victim", "..", ".", "a?b", "a#b", "%41", "s p", "ü/é", "/lead", "trail/",
           "tab\there", " lead space", "trail space "]


@pytest.fixture
def client(store: Store) -> TestClient:
    roles = {"admin": "all", "viewer": "read_only"}
    return TestClient(create_app(store, auth=BasicAuth({"admin": "pw", "viewer": "pw"}),
                                 permissions=lambda user: roles.get(user, "forbidden"),
                                 redactor=Redactor(secret_keys=("iban",))))


def csrf(client: TestClient) -> str:
    page = client.get("/jobs?queue=mail", headers=ADMIN).text
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)[1]  # type: ignore[index]


def shown_id(page: str) -> str:
    return html.unescape(re.search(r'id="job-id">([^<]*)<', page)[1])  # type: ignore[index]


def fail(store: Store, job_id: str, error: str = "boom") -> None:
    q = store.queue("mail")
    q.enqueue(job_id, {"was": job_id})
    q.fail(q.claim_one(job_id, W, lease_s=600), error)  # type: ignore[arg-type]


def test_a_link_to_a_job_opens_that_job_whatever_its_id(client: TestClient,
                                                        store: Store) -> None:
    # Given failed jobs whose ids are URL syntax, and the jobs they could be mistaken for
    for job_id in ["victim", "a", "A", *URL_IDS]:
        fail(store, job_id)
    page = client.get("/jobs?queue=mail&status=failed", headers=ADMIN).text
    links = {html.unescape(m[2]): html.unescape(m[1]) for m in re.finditer(
        r'class="job-link" href="([^"]+)">([^<]*)<', page)}
    for job_id in URL_IDS:
        # When the link is followed as a browser would (dot segments resolved)
        opened = client.get(links[job_id], headers=ADMIN)
        # Then it opens that job's page
        assert opened.status_code == 200 and shown_id(opened.text) == job_id, job_id


def test_an_edit_goes_back_to_the_job_edited(client: TestClient, store: Store) -> None:
    for job_id in ["a", "victim", *URL_IDS]:
        fail(store, job_id)
    token = csrf(client)
    for job_id in URL_IDS:
        edited = client.post("/edit", headers=ADMIN, follow_redirects=False, data={
            "csrf_token": token, "queue": "mail", "job_id": job_id, "payload": '{"n": 9}'})
        assert edited.status_code == 303
        assert store.get("mail", job_id).payload == {"n": 9}  # type: ignore[union-attr]
        back = client.get(edited.headers["location"], headers=ADMIN)
        assert shown_id(back.text) == job_id, job_id
    assert store.get("mail", "victim").payload == {"was": "victim"}  # type: ignore[union-attr]


def test_an_action_acts_on_the_job_named(client: TestClient, store: Store) -> None:
    for job_id in ["a", "victim", *URL_IDS]:
        fail(store, job_id)
    done = client.post("/action", headers=ADMIN, data={
        "csrf_token": csrf(client), "queue": "mail", "action": "cancel", "job_id": URL_IDS})
    assert done.status_code == 200
    statuses = {j: store.get("mail", j).status for j in ["a", "victim", *URL_IDS]}  # type: ignore[union-attr]
    assert statuses == {"a": "failed", "victim": "failed", **dict.fromkeys(URL_IDS, "cancelled")}


#: Ids a browser's form would change: HTML reads a CR (alone or before LF) on the page as LF,
#: and a form sends every line break as CR LF.
LINE_BREAK_IDS = ["line\nbreak", "cr\r\nlf", "lone\rcr"]


def as_a_browser_submits(page: str, form_action: str) -> dict[str, list[str]]:
    """The fields of the page's form posting to ``form_action``, as a browser sends them."""
    form = re.search(rf'<form method="post" action="{form_action}".*?</form>', page, re.DOTALL)
    fields: dict[str, list[str]] = {}
    for m in re.finditer(r'<input type="(?:hidden|checkbox)" name="([^"]+)" value="([^"]*)"',
                         form[0]):  # type: ignore[index]
        read = html.unescape(_as_a_browser_reads_it(m[2]))
        fields.setdefault(m[1], []).append(read.replace("\n", "\r\n"))
    return fields


def _as_a_browser_reads_it(job_id: str) -> str:
    return job_id.replace("\r\n", "\n").replace("\r", "\n")


@pytest.mark.parametrize("job_id", LINE_BREAK_IDS)
def test_the_job_pages_form_acts_on_its_job_when_its_id_holds_a_line_break(
        client: TestClient, store: Store, job_id: str) -> None:
    # Given a failed job whose id holds a line break, and the jobs a browser could mistake
    # it for (the id as the page is read, and as the form would send it)
    read = _as_a_browser_reads_it(job_id)
    others = {read, read.replace("\n", "\r\n")} - {job_id}
    for each in [job_id, *others]:
        fail(store, each)
    page = client.get(f"/job/mail?id={url_part(job_id)}", headers=ADMIN).text
    # When its page's cancel form is sent as a browser sends it
    fields = as_a_browser_submits(page, "/action")
    done = client.post("/action", headers=ADMIN, data={**fields, "action": "cancel"})
    # Then that job, and only that job, is cancelled
    assert done.status_code == 200
    assert store.get("mail", job_id).status == "cancelled"  # type: ignore[union-attr]
    assert [store.get("mail", o).status for o in others] == ["failed"] * len(others)  # type: ignore[union-attr]


def test_a_job_ref_that_is_not_utf_8_is_refused(client: TestClient, store: Store) -> None:
    fail(store, "ref-1")
    answer = client.post("/action", headers=ADMIN, data={
        "csrf_token": csrf(client), "queue": "mail", "action": "cancel",
        "job_ref": ["ref-1", "%FF"]})
    assert answer.status_code == 400 and "percent-encoded UTF-8" in answer.text
    assert store.get("mail", "ref-1").status == "failed"  # type: ignore[union-attr]


def test_errors_and_journal_reasons_are_shown_through_the_redactor(
    client: TestClient, store: Store
) -> None:
    # Given a job failed with a secret in its error, retried once with it in the reason
    q = store.queue("mail")
    q.enqueue("j1", {})
    q.retry_later(q.claim_one("j1", W, lease_s=600), "iban=DE89370400440532013000",  # type: ignore[arg-type]
                  delay_s=0)
    q.fail(q.claim_one("j1", W, lease_s=600), "bank rejected iban=DE89370400440532013000")  # type: ignore[arg-type]
    # When a read-only user reads the jobs list and the job's page
    for path in ("/jobs?queue=mail", "/jobs?queue=mail&status=failed", "/job/mail/j1"):
        page = client.get(path, headers=VIEWER).text
        # Then the secret is nowhere on them, and the rest of the error is
        assert "DE8937" not in page and "bank rejected" in page, path


def test_a_read_only_user_cannot_search_the_real_error_text(client: TestClient,
                                                            store: Store) -> None:
    # Given a job whose error holds a secret the page masks
    fail(store, "j1", "bank rejected iban=DE89370400440532013000")
    # When a read-only user searches the error text (a guess at the secret, and a wrong one)
    right = client.get("/jobs?queue=mail&error=iban%3DDE8937", headers=VIEWER)
    wrong = client.get("/jobs?queue=mail&error=iban%3DDE0000", headers=VIEWER)
    # Then both are refused alike: the answer tells nothing of the secret
    assert (right.status_code, wrong.status_code) == (400, 400)
    assert 'name="error"' not in client.get("/jobs?queue=mail", headers=VIEWER).text
    # And a user who may edit (and so sees real values) still searches it
    found = client.get("/jobs?queue=mail&error=iban%3DDE8937", headers=ADMIN)
    assert found.status_code == 200 and 'name="job_ref" value="j1"' in found.text


@pytest.mark.parametrize("path", [
    "/jobs?queue=mail&status=failed&cursor=%5B%22abc%22%2C%22x%22%5D",
    "/jobs?queue=mail&status=failed&cursor=%5B1e400%2C%22x%22%5D",
    "/jobs?queue=mail&status=failed&cursor=%5Btrue%2C%22x%22%5D",
    # a lone surrogate (a JSON escape) and a cursor nested too deeply: they had reached the
    # store, or the JSON decoder's recursion limit, and answered 500
    "/jobs?queue=mail&status=failed&cursor=%5B1%2C%22%5Cud800%22%5D",
    "/jobs?queue=mail&cursor=%5B%22%5Cud800%22%2C%22x%22%5D",
    "/jobs?queue=mail&task=send&cursor=" + "%5B" * 5000,
    # an integer past a float's range, and a NUL in the id: a 500 (an OverflowError; on
    # PostgreSQL the statement's own error)
    "/jobs?queue=mail&status=failed&cursor=%5B1" + "0" * 400 + "%2C%22x%22%5D",
    "/jobs?queue=mail&cursor=%5Bnull%2C%22x%5Cu0000%22%5D",
    "/jobs?queue=mail&status=failed&cursor=%5B1%2C%22x%5Cu0000%22%5D",
    "/jobs?queue=%00", "/jobs?queue=mail&status=%00", "/job/mail/%00", "/job/%00/x",
    "/job/mail?id=%00", "/job/mail",
])
def test_a_query_no_page_gave_is_refused(client: TestClient, path: str) -> None:
    assert client.get(path, headers=ADMIN).status_code == 400


def test_an_edit_nested_too_deeply_is_refused_and_changes_nothing(client: TestClient,
                                                                  store: Store) -> None:
    fail(store, "j1")
    answer = client.post("/edit", headers=ADMIN, data={
        "csrf_token": csrf(client), "queue": "mail", "job_id": "j1",
        "payload": "[" * 5000 + "]" * 5000})
    assert answer.status_code == 400 and "nested too deeply" in answer.text
    assert store.get("mail", "j1").status == "failed"  # type: ignore[union-attr]


@pytest.mark.parametrize(("path", "form"), [
    ("/action", {"action": "cancel", "job_id": "f-1"}),
    ("/edit", {"job_id": "f-1", "payload": "{}"}),
    ("/edit", {"queue": "mail", "payload": "{}"}),
    ("/edit", {"queue": "mail", "job_id": "f-1"}),
    ("/schedule", {"action": "pause"}),
    ("/bulk", {"action": "cancel", "status": "pending"}),  # it counted the first queue's
])
def test_a_form_without_a_field_it_needs_is_refused(client: TestClient, path: str,
                                                    form: dict[str, str]) -> None:
    answer = client.post(path, headers=ADMIN, data={"csrf_token": csrf(client), **form})
    assert answer.status_code == 400 and "the form has no" in answer.text

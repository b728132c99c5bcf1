"""The dashboard over HTTP: closed by default, permissions and CSRF enforced on the server,
every piece of job data escaped, payloads redacted for display only, bulk actions on the
counted snapshot."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
from dashboard_data import XSS, basic
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from leaseq.browse import JobFilter
from leaseq.dashboard import BasicAuth, LoginToken, create_app
from leaseq.dashboard.stats import StatsSnapshot
from leaseq.errors import InvalidInput
from leaseq.stores.base import Store

PAGES = ["/", "/jobs", "/jobs?queue=mail&status=failed", "/quarantine", "/workers", "/health",
         "/api/stats", "/job/mail/f-1", "/schedules"]
ADMIN = basic("admin", "pw")
VIEWER = basic("viewer", "pw")


class Elements(HTMLParser):
    """Every element of a page with its attributes: what a browser would build."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Elements()
    parser.feed(html)
    return parser.found


def roles(user: str) -> str:
    return {"admin": "all", "viewer": "read_only", "canceller": ["cancel"]}.get(user, "forbidden")


@pytest.fixture
def client(store: Store) -> TestClient:
    users = {"admin": "pw", "viewer": "pw", "canceller": "pw", "stranger": "pw"}
    return TestClient(create_app(store, auth=BasicAuth(users), permissions=roles))


def csrf(client: TestClient, headers: dict[str, str]) -> str:
    page = client.get("/jobs?queue=mail", headers=headers).text
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)[1]  # type: ignore[index]


def test_every_page_answers_401_until_auth_is_configured(store: Store) -> None:
    client = TestClient(create_app(store))
    for path in PAGES:
        assert client.get(path).status_code == 401, path
    assert client.post("/action", data={"action": "cancel"}).status_code == 401


def test_basic_auth_lets_in_only_known_credentials(client: TestClient) -> None:
    assert client.get("/").status_code == 401
    assert client.get("/", headers=basic("admin", "wrong")).status_code == 401
    assert "Basic" in client.get("/").headers["www-authenticate"]
    for path in PAGES:
        response = client.get(path, headers=ADMIN)
        assert response.status_code == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert "unsafe-inline" not in response.headers["content-security-policy"]


@pytest.mark.parametrize("users", [{}, {"": ""}, {"ops": ""}, {"": "pw"}, {"a:b": "pw"}],
                         ids=["none", "both-empty", "empty-password", "empty-user", "colon"])
def test_basic_auth_refuses_credentials_no_one_should_sign_in_with(
        users: dict[str, str]) -> None:
    # {"": ""} would let in a header of just ":" ("Og=="); "a:b" could never sign in.
    with pytest.raises(InvalidInput, match="non-empty password"):
        BasicAuth(users)


def test_a_login_token_is_good_once_and_sets_a_session(store: Store) -> None:
    client = TestClient(create_app(store, auth=LoginToken("t0k3n"), permissions="all"))
    assert client.get("/login?token=wrong").status_code == 401
    # A HEAD (a link checker's, a chat's preview) signs no one in and spends nothing
    head = client.head("/login?token=t0k3n", follow_redirects=False)
    assert head.status_code == 204 and "set-cookie" not in head.headers
    first = client.get("/login?token=t0k3n", follow_redirects=False)
    assert first.status_code == 303 and "httponly" in first.headers["set-cookie"].lower()
    assert client.get("/").status_code == 200
    # The token is spent: a second browser cannot use it
    other = TestClient(create_app(store, auth=LoginToken("t0k3n"), permissions="all"))
    other.app.state.dashboard.auth = client.app.state.dashboard.auth  # type: ignore[attr-defined]
    assert other.get("/login?token=t0k3n").status_code == 401
    assert other.get("/").status_code == 401


def test_a_forbidden_user_sees_no_page(client: TestClient) -> None:
    assert client.get("/", headers=basic("stranger", "pw")).status_code == 403


def test_read_only_sees_no_action_and_a_forged_post_is_refused(
    client: TestClient, store: Store
) -> None:
    page = client.get("/jobs?queue=mail", headers=VIEWER).text
    assert not [a for tag, a in elements(page) if tag == "button" and a.get("name") == "action"]
    job_page = client.get("/job/mail/f-1", headers=VIEWER).text
    assert not [a for tag, a in elements(job_page) if tag in ("button", "textarea")]
    token = csrf(client, VIEWER)
    forged = client.post("/action", headers=VIEWER, data={
        "csrf_token": token, "queue": "mail", "action": "requeue", "job_id": "f-1"})
    assert forged.status_code == 403
    assert store.get("mail", "f-1").status == "failed"  # type: ignore[union-attr]


def test_per_action_permissions(client: TestClient, store: Store) -> None:
    who = basic("canceller", "pw")
    token = csrf(client, who)
    requeue = client.post("/action", headers=who, data={
        "csrf_token": token, "queue": "mail", "action": "requeue", "job_id": "f-1"})
    assert requeue.status_code == 403
    cancel = client.post("/action", headers=who, data={
        "csrf_token": token, "queue": "mail", "action": "cancel", "job_id": "f-1"})
    assert cancel.status_code == 200
    assert store.get("mail", "f-1").status == "cancelled"  # type: ignore[union-attr]
    assert store.journal("mail", "f-1")[-1].reason == "by canceller"


def test_a_form_asks_only_for_its_own_routes_actions(client: TestClient, store: Store) -> None:
    # Given a user allowed only to cancel, and a failed job and a paused schedule
    who = basic("canceller", "pw")
    token = csrf(client, who)
    assert store.pause_schedule("nightly-digest", True)
    # When they name their own action on another route's form
    edit = client.post("/edit", headers=who, data={
        "csrf_token": token, "action": "cancel", "queue": "mail", "job_id": "f-1",
        "payload": '{"to": "attacker@example.com"}'})
    resume = client.post("/schedule", headers=who, data={
        "csrf_token": token, "action": "cancel", "name": "nightly-digest"})
    # Then neither form takes it: the edit needs "edit", the schedule "pause"
    assert (edit.status_code, resume.status_code) == (400, 400)
    job = store.get("mail", "f-1")
    assert job is not None and job.status == "failed"
    assert "attacker@example.com" not in str(job.payload)
    assert store.schedule_state("nightly-digest").paused  # type: ignore[union-attr]
    # And an action no form has is refused on the bulk forms too, for every user
    admin = csrf(client, ADMIN)
    for path in ("/action", "/bulk"):
        odd = client.post(path, headers=ADMIN, data={
            "csrf_token": admin, "action": "pause", "queue": "mail", "job_id": "f-1"})
        assert odd.status_code == 400, path


def test_a_post_without_the_csrf_token_or_from_another_site_is_refused(
    client: TestClient, store: Store
) -> None:
    form = {"queue": "mail", "action": "requeue", "job_id": "f-1"}
    assert client.post("/action", headers=ADMIN, data=form).status_code == 403
    for bad in ("0" * 64, "é" * 64):
        wrong = {**form, "csrf_token": bad}
        assert client.post("/action", headers=ADMIN, data=wrong).status_code == 403
    good = {**form, "csrf_token": csrf(client, ADMIN)}
    cross = client.post("/action", headers={**ADMIN, "Sec-Fetch-Site": "cross-site"}, data=good)
    assert cross.status_code == 403
    assert store.get("mail", "f-1").status == "failed"  # type: ignore[union-attr]
    same = client.post("/action", headers={**ADMIN, "Sec-Fetch-Site": "same-origin"},
                       data=good)
    assert same.status_code == 200
    assert store.get("mail", "f-1").status == "pending"  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["/jobs?queue=xss", "/quarantine",
                                  *[f"/job/xss/{quote(f'x{i}-{p}', safe='')}"
                                    for i, p in enumerate(XSS)]])
def test_job_data_is_rendered_inert(client: TestClient, path: str) -> None:
    html = client.get(path, headers=ADMIN).text
    found = elements(html)
    scripts = [a for tag, a in found if tag == "script"]
    assert scripts == [{"src": "/static/dashboard.js", "defer": None}]
    assert not [(t, a) for t, a in found if t in ("img", "svg")]
    handlers = [(t, k) for t, a in found for k in a if k.startswith("on")]
    assert handlers == []
    links = [a.get("href") or "" for t, a in found if t == "a"]
    assert not [h for h in links if h.lower().startswith("javascript:")]


def test_payloads_are_redacted_for_display_and_edited_from_the_real_values(
    client: TestClient, store: Store
) -> None:
    viewer_page = client.get("/job/mail/f-1", headers=VIEWER).text
    assert "hunter2" not in viewer_page
    admin_page = client.get("/job/mail/f-1", headers=ADMIN).text
    (textarea,) = re.findall(r'<textarea[^>]*>(.*?)</textarea>', admin_page, re.S)
    assert "hunter2" in textarea  # the editor starts from the real values
    shown = re.search(r'<pre id="payload">(.*?)</pre>', admin_page, re.S)[1]  # type: ignore[index]
    assert "hunter2" not in shown
    # When the admin saves an edit, the real value goes back, never the redacted one
    edited = client.post("/edit", headers=ADMIN, follow_redirects=False, data={
        "csrf_token": csrf(client, ADMIN), "queue": "mail", "job_id": "f-1",
        "payload": '{"token": "password=hunter2", "retry": true}'})
    assert edited.status_code == 303
    job = store.get("mail", "f-1")
    assert job.status == "pending" and job.payload["token"] == "password=hunter2"  # type: ignore[union-attr]
    assert [e.event for e in store.journal("mail", "f-1")][-2:] == ["edited", "requeued"]


def test_counts_awaiting_confirmation_are_kept_up_to_a_bound_the_oldest_dropped_first(
    client: TestClient, store: Store
) -> None:
    from leaseq.dashboard.app import SNAPSHOTS_KEPT

    token = csrf(client, ADMIN)

    def count() -> str:
        counted = client.post("/bulk", headers=ADMIN, data={
            "csrf_token": token, "queue": "mail", "status": "pending", "action": "cancel"})
        return re.search(r'name="snapshot" value="([^"]+)"', counted.text)[1]  # type: ignore[index]

    # Given as many counts as are kept, then one more
    first, second = count(), count()
    for _ in range(SNAPSHOTS_KEPT - 1):
        count()
    # Then the oldest made room (each holds up to 100,000 ids), and the next is still there
    for snapshot, status in ((first, 409), (second, 200)):
        confirmed = client.post("/bulk/confirm", headers=ADMIN, data={
            "csrf_token": token, "snapshot": snapshot, "action": "cancel"})
        assert confirmed.status_code == status


def test_the_filter_keeps_an_apps_own_status_and_a_queue_emptied_meanwhile(
    client: TestClient, store: Store
) -> None:
    # Given a job finished in an app's own terminal status
    q = store.queue("mail")
    q.enqueue("s-1", {})
    q.complete(q.claim_one("s-1", "w", lease_s=60), status="skipped")  # type: ignore[arg-type]
    # When the jobs page is opened on it, and on a queue that holds no job
    page = client.get("/jobs?queue=mail&status=skipped", headers=ADMIN).text
    empty = client.get("/jobs?queue=gone-now", headers=ADMIN).text
    # Then each is the filter's selected choice: pressed again, Filter keeps them
    assert '<option value="skipped" selected>skipped</option>' in page
    assert 's-1' in page
    assert '<option value="gone-now" selected>gone-now</option>' in empty


def test_a_payload_near_the_queues_limit_is_edited_from_its_editor_as_shown(
    client: TestClient, store: Store
) -> None:
    # Given a failed job whose payload is a third of the default 1 MiB limit
    q = store.queue("mail")
    q.enqueue("big", {"items": ["ab"] * 60_000})
    q.fail(q.claim_one("big", "w", lease_s=60), "boom")  # type: ignore[arg-type]
    page = client.get("/job/mail?id=big", headers=ADMIN).text
    editor = html.unescape(re.findall(r'<textarea[^>]*>(.*?)</textarea>', page, re.S)[0])
    # When the admin saves the editor's text as a browser sends it (CR LF line breaks)
    saved = client.post("/edit", headers=ADMIN, follow_redirects=False, data={
        "csrf_token": csrf(client, ADMIN), "queue": "mail", "job_ref": "big",
        "payload": editor.replace("\n", "\r\n")})
    # Then it is taken (the form's field was 4 times the payload: over Starlette's 1 MiB)
    assert saved.status_code == 303, saved.text[:200]
    assert store.get("mail", "big").status == "pending"  # type: ignore[union-attr]


def test_a_secret_in_a_payload_strings_lines_is_redacted_for_display(
    client: TestClient, store: Store
) -> None:
    # Given a payload whose strings hold a config: a value on the line after its key, and a
    # YAML block (in the JSON shown, their line breaks are written \n)
    store.queue("mail").enqueue("cfg", {
        "config": "db:\n  password: |\n    Zq9hunter2\n  port: 5432\n",
        "note": "token:\n  Zq9tok3n"})
    # When a viewer opens the job, Then neither secret is on the page
    page = client.get("/job/mail/cfg", headers=VIEWER).text
    assert "Zq9hunter2" not in page and "Zq9tok3n" not in page
    assert "port: 5432" in page  # the rest of the config as it was


def test_bulk_shows_the_count_then_acts_only_on_the_counted_jobs(
    client: TestClient, store: Store
) -> None:
    token = csrf(client, ADMIN)
    counted = client.post("/bulk", headers=ADMIN, data={
        "csrf_token": token, "queue": "mail", "status": "pending", "action": "cancel"})
    assert counted.status_code == 200 and ">cancel 3 job(s)?<" in counted.text
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', counted.text)[1]  # type: ignore[index]
    store.queue("mail").enqueue("late", {})  # matches the filter after the count
    # A confirmation for another action than the one counted is refused
    other = client.post("/bulk/confirm", headers=ADMIN, data={
        "csrf_token": token, "snapshot": snapshot, "action": "delete"})
    assert other.status_code == 409
    counted = client.post("/bulk", headers=ADMIN, data={
        "csrf_token": token, "queue": "mail", "status": "pending", "task": "send",
        "action": "cancel"})
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', counted.text)[1]  # type: ignore[index]
    done = client.post("/bulk/confirm", headers=ADMIN, data={
        "csrf_token": token, "snapshot": snapshot, "action": "cancel"})
    assert done.status_code == 200 and "3 job(s) changed" in done.text
    assert store.get("mail", "late").status == "pending"  # type: ignore[union-attr]
    assert store.find_jobs(JobFilter("mail", status="pending")).jobs[0].id == "late"
    again = client.post("/bulk/confirm", headers=ADMIN, data={
        "csrf_token": token, "snapshot": snapshot, "action": "cancel"})
    assert again.status_code == 409  # a snapshot is used once


def test_mounted_under_a_prefix_links_stay_inside_it(store: Store) -> None:
    inner = create_app(store, auth=BasicAuth({"admin": "pw"}), permissions="all")
    client = TestClient(Starlette(routes=[Mount("/ops/queue", app=inner)]))
    page = client.get("/ops/queue/jobs?queue=mail", headers=ADMIN)
    assert page.status_code == 200
    links = [a["href"] for t, a in elements(page.text) if t == "a" and a.get("href")]
    assert links and all(h.startswith("/ops/queue/") for h in links)
    assert client.get("/ops/queue/static/dashboard.js").status_code == 200


def test_one_stats_snapshot_per_second_however_many_readers(store: Store) -> None:
    now = [100.0]
    stats = StatsSnapshot(store, clock=lambda: now[0])
    for _ in range(50):
        stats.get()
    assert stats.reads == 1
    now[0] += 0.99
    stats.get()
    assert stats.reads == 1
    now[0] += 0.02
    mail = next(r for r in stats.get() if r["queue"] == "mail")
    assert stats.reads == 2
    assert mail["counts"]["failed"] == "2" and mail["failed_last_hour"] == 2


def test_the_last_hour_is_the_hour_up_to_now_not_the_clock_hour(store: Store) -> None:
    # Given mail's 2 quarantines and 1 result, 59 minutes old: in another clock hour, or in
    # the same one, whatever the time now
    store.time_offset_s += 59 * 60
    now = [100.0]
    stats = StatsSnapshot(store, clock=lambda: now[0])

    def mail() -> dict[str, object]:
        now[0] += 2  # past the snapshot's age
        return next(r for r in stats.get() if r["queue"] == "mail")

    # Then the overview counts them in its last hour (it had counted from the clock hour's
    # start only, so they dropped out at every hour)
    assert (mail()["done_last_hour"], mail()["failed_last_hour"]) == (1, 2)
    # And two minutes later they are more than an hour old
    store.time_offset_s += 120
    assert (mail()["done_last_hour"], mail()["failed_last_hour"]) == (0, 0)


def test_the_event_stream_sends_the_shared_snapshot(store: Store) -> None:
    client = TestClient(create_app(store, auth=BasicAuth({"admin": "pw"}), sse_every_s=0.01))
    with client.stream("GET", "/events", headers=ADMIN) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        line = next(iter(response.iter_lines()))
    assert line.startswith("data: [") and '"queue": "mail"' in line


@pytest.mark.parametrize("spec_json", ["{}", "[]", "not json", '{"task": "t", "cron": "x"}'])
def test_a_schedule_whose_spec_cannot_be_read_is_shown_with_the_rest(
    client: TestClient, store: Store, spec_json: str
) -> None:
    # Given a ledger record this code cannot read (another version's, or damaged)
    store.register_schedule("odd", "mail", spec_json)
    # When the page lists the schedules, Then it shows the rest and that one by name
    page = client.get("/schedules", headers=ADMIN)
    assert page.status_code == 200
    assert "nightly-digest" in page.text and "odd" in page.text


def test_schedules_show_their_ticks_and_pause_by_permission(
    client: TestClient, store: Store
) -> None:
    # Given a schedule in the ledger
    page = client.get("/schedules", headers=ADMIN).text
    assert "nightly-digest" in page and "every 86400 s" in page
    # A read-only user sees no button, and a forged pause is refused
    assert 'value="pause"' not in client.get("/schedules", headers=VIEWER).text
    forged = client.post("/schedule", headers=VIEWER, data={
        "csrf_token": csrf(client, VIEWER), "name": "nightly-digest", "action": "pause"})
    assert forged.status_code == 403 and not store.schedule_state("nightly-digest").paused  # type: ignore[union-attr]
    # When the admin pauses it, then resumes it
    token = csrf(client, ADMIN)
    for action, paused in (("pause", True), ("resume", False)):
        done = client.post("/schedule", headers=ADMIN, follow_redirects=False, data={
            "csrf_token": token, "name": "nightly-digest", "action": action})
        assert done.status_code == 303
        assert store.schedule_state("nightly-digest").paused is paused  # type: ignore[union-attr]
    # Then the journal says who did each
    reasons = [e.reason for e in store.journal("mail", "schedule:nightly-digest")
               if e.event == "operator_action"]
    assert reasons == ["paused by admin", "resumed by admin"]


def test_bad_input_gets_a_clear_refusal(client: TestClient, store: Store) -> None:
    assert client.get("/job/mail/nope", headers=ADMIN).status_code == 404
    assert client.get("/jobs?queue=mail&from=yesterday", headers=ADMIN).status_code == 400
    assert client.get("/jobs?queue=mail&cursor=garbage", headers=ADMIN).status_code == 400
    token = csrf(client, ADMIN)
    not_json = client.post("/edit", headers=ADMIN, data={
        "csrf_token": token, "queue": "mail", "job_id": "f-2", "payload": "{oops"})
    assert not_json.status_code == 400
    live = client.post("/edit", headers=ADMIN, data={
        "csrf_token": token, "queue": "mail", "job_id": "p-0", "payload": "{}"})
    assert live.status_code == 409
    assert store.get("mail", "p-0").payload == {"to": "user0@example.com"}  # type: ignore[union-attr]
    reserved = client.post("/edit", headers=ADMIN, data={
        "csrf_token": token, "queue": "mail", "job_id": "f-2", "payload": '{"status": 1}'})
    assert reserved.status_code == 400


def test_a_jobs_page_reads_its_story_against_the_map(client: TestClient, store: Store) -> None:
    # Given a job retried twice for the same reason
    q = store.queue("mail")
    q.enqueue("r-1", {})
    for _ in range(2):
        q.retry_later(q.claim_one("r-1", "w", lease_s=60), "KeyError: 'name'", delay_s=0)  # type: ignore[arg-type]
    # Then its page names the symptom, the likely cause and the action
    page = client.get("/job/mail/r-1", headers=ADMIN).text
    assert "same_reason_retried" in page and "leaseq cancel --queue mail r-1" in page
    assert "same_reason_retried" not in client.get("/job/mail/f-1", headers=ADMIN).text


def test_workers_show_who_is_live_and_who_fell_silent(client: TestClient, store: Store) -> None:
    store.time_offset_s = 120  # the fixture's worker last beat two minutes ago
    store.register_worker("host:2:bbbb0002", ["mail", "xss"], 2)
    page = client.get("/workers", headers=ADMIN).text
    rows = re.findall(r"<tr><td>(host:[^<]+)</td>.*?class=\"(live|silent)\"", page, re.S)
    assert rows == [("host:1:aaaa0001", "silent"), ("host:2:bbbb0002", "live")]


@pytest.mark.parametrize("payload", [
    {"password": ["Zq9list"]},
    {"api_key": {"v": "Zq9nested"}},
    {"outer": [{"client_secret": {"parts": ["Zq9deep", 7]}}]},
])
def test_a_read_only_user_sees_no_secret_held_in_a_list_or_an_object(
    client: TestClient, store: Store, payload: dict[str, object]
) -> None:
    # Given a failed job whose secret-named field holds a list or an object
    q = store.queue("mail")
    q.enqueue("nested", payload, task="send")
    q.fail(q.claim_one("nested", "host:1:aaaa0001", lease_s=600), "boom")  # type: ignore[arg-type]
    # When a read-only user opens its page
    page = client.get("/job/mail/nested", headers=VIEWER).text
    # Then no secret string is on it, and the field's key still is
    assert "Zq9" not in page
    assert next(iter(payload)) in page

"""The dashboard as an ASGI app (Starlette + Jinja2): mount it anywhere, under any prefix.

Every request passes ``_guard``: signed in (else 401), not forbidden (else 403), and for a
POST the CSRF token and ``Sec-Fetch-Site`` checked and the action permitted (else 403), all on
the server. Job data reaches the page only through Jinja2's autoescaping; payloads are shown
through the redactor, by key then as text, and errors and journal reasons as text (display
only: the editor starts from the real values, shown only to a user allowed to edit, and nothing
redacted is ever written back). A job's page is ``/job/<queue>?id=<job id>``: an id is any
text, and in a query it needs no path rules (a path segment ``..`` is resolved away by every
URL parser, even percent-encoded).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

from leaseq import validate
from leaseq.browse import SNAPSHOT_MAX, SUMMARY_STATUSES, BulkAction, JobFilter
from leaseq.dashboard.security import (
    BULK_ASKS,
    EDIT_ASKS,
    SCHEDULE_ASKS,
    SESSION_COOKIE,
    Access,
    Auth,
    LoginToken,
    Permissions,
    csrf_token,
    resolve,
    same_origin_post,
)
from leaseq.dashboard.stats import StatsSnapshot
from leaseq.doctor import DoctorConfig, diagnose, diagnose_job
from leaseq.errors import InvalidInput, LeaseqError
from leaseq.journal import JournalEvent
from leaseq.ledger import ScheduleState, format_tick, schedule_journal_id
from leaseq.redact import fields_masker, redact, redacted_strings
from leaseq.scheduler.spec import Schedule
from leaseq.stores.base import Store
from leaseq.timeline import format_duration, read_timeline

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
#: How long a counted bulk snapshot may wait for its confirmation.
SNAPSHOT_TTL_S = 600.0
#: The most counts kept awaiting confirmation at once (a new one makes room by the oldest).
SNAPSHOTS_KEPT = 100
PAGE_SIZE = 50
#: The most one field of a signed-in user's form may hold: the editor's payload, pretty-printed
#: and form-encoded, comes to about 4 times its stored size (8 for text outside ASCII), so a
#: payload at the default 1 MiB limit fits; Starlette's own 1 MiB refused one of 300 KB.
FORM_FIELD_BYTES = 16 * 1024 * 1024
#: The permission that shows real values (the payload editor) and so may search the real
#: error text; everyone else sees jobs only through the redactor.
UNREDACTED = "edit"


def create_app(store: Store, auth: Auth | None = None, permissions: Permissions = "read_only",
               *, redactor: Callable[[str], str] = redact, sse_every_s: float = 2.0) -> Starlette:
    """The dashboard over ``store``. ``auth(request)`` names the signed-in user (None: not
    signed in); with no ``auth`` every page answers 401. ``permissions``: ``"all"``,
    ``"read_only"`` (the default), a set of actions, ``"forbidden"``, or a callable
    ``user → one of those``."""
    ui = Dashboard(store, auth, permissions, redactor, sse_every_s)
    static = resources.files("leaseq.dashboard").joinpath("static")
    routes = [Route(path, ui.handle(handler, asks), methods=["POST" if asks else "GET"])
              for path, handler, asks in ui.routes()]
    app = Starlette(routes=routes)
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.state.dashboard = ui
    return app


class Dashboard:
    def __init__(self, store: Store, auth: Auth | None, permissions: Permissions,
                 redactor: Callable[[str], str], sse_every_s: float):
        self.store = store
        self.auth = auth
        self.permissions = permissions
        self.redactor = redactor
        self.masked_fields = fields_masker(redactor)
        self.sse_every_s = sse_every_s
        self.secret = secrets.token_bytes(32)
        self.stats = StatsSnapshot(store)
        self.snapshots: dict[str, tuple[float, str, str, BulkAction, list[str]]] = {}
        """Counted bulk actions awaiting their confirmation, by token (under
        ``_snapshots_lock``: the handlers run on a pool's threads)."""
        self._snapshots_lock = threading.Lock()
        self.env = Environment(loader=PackageLoader("leaseq.dashboard", "templates"),
                               autoescape=select_autoescape(default=True))
        self.env.filters["duration"] = format_duration
        self.env.filters["redact"] = lambda text: redactor(text or "")
        self.env.filters["ref"] = url_part  # a job id in a form: see _job_ids
        self.env.globals.update(job_path=job_path, unredacted=UNREDACTED)

    def routes(self) -> list[tuple[str, Callable[..., Any], Mapping[str, str] | None]]:
        """Each page: its path, its handler, and for a POST form what it may ask (``*_ASKS``);
        None for a GET page."""
        return [
            ("/", self.overview, None), ("/jobs", self.jobs, None),
            ("/job/{queue}", self.job, None), ("/job/{queue}/{job_id:path}", self.job, None),
            ("/quarantine", self.quarantine, None), ("/workers", self.workers, None),
            ("/health", self.health, None), ("/api/stats", self.api_stats, None),
            ("/events", self.events, None), ("/action", self.action, BULK_ASKS),
            ("/bulk", self.bulk_count, BULK_ASKS), ("/bulk/confirm", self.bulk_confirm, BULK_ASKS),
            ("/edit", self.edit, EDIT_ASKS), ("/login", self.no_login, None),
            ("/schedules", self.schedules, None), ("/schedule", self.pause, SCHEDULE_ASKS),
        ]

    # --- the guard --------------------------------------------------------------------------

    def handle(self, handler: Callable[..., Any],
               asks: Mapping[str, str] | None) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if request.scope["path"] == _root(request) + "/login" and \
                    isinstance(self.auth, LoginToken):
                return self._login(request)
            user = self.auth(request) if self.auth is not None else None
            if user is None:
                return self._unauthorized()
            access = resolve(self.permissions, user)
            if access is None:
                return PlainTextResponse("forbidden", 403, headers=_headers())
            if asks is not None:
                refused = await self._check_post(request, access, asks)
                if refused is not None:
                    return refused
            try:
                # Store calls block: a worker thread runs them, never the event loop.
                response = await run_in_threadpool(handler, request, access)
            except LeaseqError as exc:
                response = PlainTextResponse(f"refused: {exc}", 400)
            response.headers.update(_headers())
            return response
        return endpoint

    def _unauthorized(self) -> Response:
        headers = _headers()
        challenge = getattr(self.auth, "challenge", None)
        if challenge:
            headers["WWW-Authenticate"] = challenge
        return PlainTextResponse("sign in first", 401, headers=headers)

    def _login(self, request: Request) -> Response:
        assert isinstance(self.auth, LoginToken)
        if request.method != "GET":  # a HEAD (a link checker's) must not spend the token
            return Response(status_code=204, headers=_headers())
        session = self.auth.redeem(request.query_params.get("token", ""))
        if session is None:
            return self._unauthorized()
        response = RedirectResponse(_root(request) + "/", 303, headers=_headers())
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict",
                            path=_root(request) or "/")
        return response

    async def _check_post(self, request: Request, access: Access,
                          asks: Mapping[str, str]) -> Response | None:
        """The CSRF check, then the permission the form's action needs on this route."""
        form = await request.form(max_part_size=FORM_FIELD_BYTES)
        request.state.form = form
        token = str(form.get("csrf_token", ""))
        if not same_origin_post(request) or not secrets.compare_digest(
                token.encode(), csrf_token(self.secret, access.user).encode()):
            return PlainTextResponse("refused: CSRF check failed", 403, headers=_headers())
        needed = asks.get(str(form.get("action", "")))
        if needed is None:
            return PlainTextResponse("refused: this form has no such action", 400,
                                     headers=_headers())
        if not access.may(needed):
            return PlainTextResponse("refused: not permitted", 403, headers=_headers())
        return None

    def render(self, request: Request, access: Access, name: str, **context: Any) -> Response:
        template = self.env.get_template(name)
        html = template.render(root=_root(request), access=access, page_name=name.split(".")[0],
                               csrf=csrf_token(self.secret, access.user), **context)
        return HTMLResponse(html)

    # --- pages ------------------------------------------------------------------------------

    def overview(self, request: Request, access: Access) -> Response:
        return self.render(request, access, "overview.html", stats=self.stats.get())

    def jobs(self, request: Request, access: Access) -> Response:
        where = _filter_from(request.query_params, self.store, access)
        page = self.store.find_jobs(where, PAGE_SIZE, request.query_params.get("cursor"))
        # The filter's own queue and status among the choices, even when they are not the
        # usual ones (a queue emptied meanwhile, an app's own terminal status): a Filter
        # pressed again keeps them, and the forms below act on the queue shown.
        queues = list(dict.fromkeys([*self.store.queues(), where.queue]))
        statuses = list(dict.fromkeys([*SUMMARY_STATUSES, *filter(None, [where.status])]))
        return self.render(request, access, "jobs.html", where=where, page=page,
                           queues=queues, statuses=statuses, query=dict(request.query_params))

    def job(self, request: Request, access: Access) -> Response:
        queue = validate.queue_name(request.path_params["queue"])
        # The id in the query (the links' form), or in the path (an older link).
        job_id = validate.job_id(request.path_params.get("job_id") or
                                 request.query_params.get("id"))
        job = self.store.get(queue, job_id)
        if job is None:
            return PlainTextResponse("no such job", 404)
        # By key first (a secret's value may be a list or an object), then each string as
        # the text it is (its line breaks real ones), then the whole as text.
        shown = self.redactor(json.dumps(
            redacted_strings(self.masked_fields(job.payload), self.redactor), indent=2,
            sort_keys=True))
        real = json.dumps(job.payload, indent=2, sort_keys=True) if access.may("edit") else None
        journal = self.store.journal(queue, job_id)
        now = self.store.server_now()
        hints = diagnose_job(job, journal, now)
        timeline = read_timeline(journal)
        # "running for" only while the record agrees: an open attempt of a job that is no
        # longer processing lost its ending row (purged, or written by an older version).
        running_now = now if job.status == "processing" else None
        return self.render(request, access, "job.html", job=job, payload=shown,
                           editable=real, journal=journal, hints=hints,
                           error=self.redactor(job.error or ""), timeline=timeline,
                           notes=timeline.notes(running_now), now=running_now)

    def quarantine(self, request: Request, access: Access) -> Response:
        groups: dict[tuple[str, str, str], int] = {}
        for queue in self.store.queues():
            page = self.store.find_jobs(JobFilter(queue, status="failed"), limit=500)
            for job in page.jobs:
                reason = (job.error or "").strip().splitlines()[-1:] or [""]
                key = (queue, job.failure or "", self.redactor(reason[0])[:200])
                groups[key] = groups.get(key, 0) + 1
        rows = sorted(groups.items(), key=lambda kv: -kv[1])
        return self.render(request, access, "quarantine.html", groups=rows)

    def workers(self, request: Request, access: Access) -> Response:
        now = self.store.server_now()
        rows = [(w, (now - w.last_beat_at).total_seconds()) for w in self.store.list_workers()]
        return self.render(request, access, "workers.html", workers=rows,
                           live_s=DoctorConfig().live_worker_s)

    def health(self, request: Request, access: Access) -> Response:
        report = diagnose(self.store)
        return self.render(request, access, "health.html", report=report)

    def schedules(self, request: Request, access: Access) -> Response:
        rows: list[dict[str, Any]] = []
        if states := self.store.schedules():  # the clock is read only for a schedule to show
            now = self.store.server_now()
            rows = [schedule_row(state, now) for state in states]
        return self.render(request, access, "schedules.html", rows=rows)

    def no_login(self, request: Request, access: Access) -> Response:
        """Signed in another way (basic auth, the host app's own): nothing to redeem."""
        return RedirectResponse(_root(request) + "/", 303)

    def api_stats(self, request: Request, access: Access) -> Response:
        return JSONResponse(self.stats.get())

    def events(self, request: Request, access: Access) -> Response:
        async def stream() -> Any:
            while not await request.is_disconnected():
                stats = await run_in_threadpool(self.stats.get)
                yield f"data: {json.dumps(stats)}\n\n"
                await asyncio.sleep(self.sse_every_s)
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    # --- actions ----------------------------------------------------------------------------

    def action(self, request: Request, access: Access) -> Response:
        form = request.state.form
        queue, action = validate.queue_name(_field(form, "queue")), BulkAction(str(form["action"]))
        ids = _job_ids(form)
        result = self.store.act_on_jobs(queue, action, ids, access.user)
        return self.render(request, access, "done.html", action=action, result=result,
                           queue=queue)

    def bulk_count(self, request: Request, access: Access) -> Response:
        form = request.state.form
        _field(form, "queue")  # an action names its queue: none is taken to mean the first
        where = _filter_from(form, self.store, access)
        action = BulkAction(str(form["action"]))
        ids = self.store.snapshot_ids(where, SNAPSHOT_MAX)
        token = secrets.token_urlsafe(16)
        with self._snapshots_lock:
            self._forget_old_snapshots()
            self.snapshots[token] = (time.monotonic(), access.user, where.queue, action, ids)
        return self.render(request, access, "confirm.html", action=action, count=len(ids),
                           token=token, where=where)

    def bulk_confirm(self, request: Request, access: Access) -> Response:
        form = request.state.form
        with self._snapshots_lock:
            found = self.snapshots.pop(str(form.get("snapshot", "")), None)
        # The action confirmed is the one counted (and the one the permission check saw).
        if found is None or found[1] != access.user or found[3] != form.get("action"):
            return PlainTextResponse("that count has expired; count again", 409)
        _, _, queue, action, ids = found
        result = self.store.act_on_jobs(queue, action, ids, access.user)
        return self.render(request, access, "done.html", action=action, result=result,
                           queue=queue)

    def edit(self, request: Request, access: Access) -> Response:
        form = request.state.form
        queue = validate.queue_name(_field(form, "queue"))
        ids = _job_ids(form)
        if not ids:
            raise InvalidInput("the form has no 'job_ref' field")
        if len(ids) > 1:
            raise InvalidInput("an edit names one job, this form names several")
        job_id, text = ids[0], _field(form, "payload")
        try:
            payload = json.loads(text)
        except ValueError:
            return PlainTextResponse("refused: the payload is not JSON", 400)
        except RecursionError:
            return PlainTextResponse("refused: the payload is nested too deeply to store", 400)
        checked = validate.payload(payload, self.store.queue(queue).policy.max_payload_bytes)
        done = self.store.requeue_edited(queue, job_id, checked, access.user)
        return RedirectResponse(_root(request) + job_path(queue, job_id), 303) if done else \
            PlainTextResponse("refused: the job is live; only a terminal job is edited", 409)

    def pause(self, request: Request, access: Access) -> Response:
        """Pause or resume a schedule; the ledger journals the change, and this the who."""
        form = request.state.form
        name, paused = _field(form, "name"), form["action"] == "pause"
        state = self.store.schedule_state(name)
        if state is None:
            return PlainTextResponse("no such schedule", 404)
        if self.store.pause_schedule(name, paused):
            word = "paused" if paused else "resumed"
            self.store.append_journal(state.queue, schedule_journal_id(name),
                                      JournalEvent.OPERATOR_ACTION,
                                      reason=f"{word} by {access.user}")
        return RedirectResponse(f"{_root(request)}/schedules", 303)

    def _forget_old_snapshots(self) -> None:
        """Drop the counts older than ``SNAPSHOT_TTL_S``, and past ``SNAPSHOTS_KEPT`` the
        oldest (each holds up to ``SNAPSHOT_MAX`` ids). Under ``_snapshots_lock``."""
        cutoff = time.monotonic() - SNAPSHOT_TTL_S
        for token in [t for t, (at, *_) in self.snapshots.items() if at < cutoff]:
            del self.snapshots[token]
        for token in list(self.snapshots)[:max(len(self.snapshots) - SNAPSHOTS_KEPT + 1, 0)]:
            del self.snapshots[token]  # in insertion order: the oldest first


def schedule_row(state: ScheduleState, now: datetime) -> dict[str, Any]:
    """One schedule as the page shows it: its spec in words, next and last tick, state."""
    try:
        schedule: Schedule | None = Schedule.from_ledger(state.name, state.queue,
                                                         state.spec_json)
    except LeaseqError:  # written by another version of the code: show what is known
        schedule = None
    upcoming = schedule.next_after(max(state.cursor, now)) if schedule and state.ticking else None
    return {"name": state.name, "queue": state.queue,
            "spec": schedule.describe() if schedule else "?",
            "timezone": schedule.timezone if schedule else "?",
            "next_tick": format_tick(upcoming) if upcoming else "",
            "last_tick": format_tick(state.last_tick) if state.last_tick else "",
            "last_job": state.last_job_id or "", "skipped": state.skipped,
            "paused": state.paused, "active": state.active}


def _headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def url_part(value: str) -> str:
    """``value`` as one part of a URL (a path segment, a query value): every character that
    means something in a URL (``/``, ``?``, ``#``, ``%``, ``&``) is percent-encoded."""
    return quote(value, safe="")


def job_path(queue: str, job_id: str) -> str:
    """The path of a job's page, below the dashboard's root."""
    return f"/job/{url_part(queue)}?id={url_part(job_id)}"


def _job_ids(form: Any) -> list[str]:
    """The jobs a form names. The pages' forms send each id percent-encoded (``job_ref``): a
    browser rewrites the line breaks of a field's value (to CR LF on submit, and a CR read
    from the page to LF), so an id holding one would name another job, or none. ``job_id``
    takes ids as they are, for forms that are not the pages' (a script's POST)."""
    refs = []
    for ref in form.getlist("job_ref"):
        try:
            refs.append(unquote(str(ref), errors="strict"))
        except UnicodeDecodeError:
            raise InvalidInput("a job_ref must be a percent-encoded UTF-8 job id") from None
    return [validate.job_id(i) for i in [*refs, *map(str, form.getlist("job_id"))]]


def _field(form: Any, name: str) -> str:
    """A form field the route needs; a form without it is refused (400)."""
    value = form.get(name)
    if value is None:
        raise InvalidInput(f"the form has no {name!r} field")
    return str(value)


def _filter_from(values: Any, store: Store, access: Access) -> JobFilter:
    queues = store.queues()
    queue = str(values.get("queue") or (queues[0] if queues else "default"))
    where = JobFilter(queue, status=values.get("status") or None,
                      task=values.get("task") or None, id_prefix=values.get("id") or None,
                      error_text=values.get("error") or None,
                      updated_from=_when(values.get("from")),
                      updated_until=_when(values.get("until")))
    if where.error_text and not access.may(UNREDACTED):
        # The search runs on the real text: its answer would tell what the redaction hides.
        raise InvalidInput(f"searching the error text needs the {UNREDACTED!r} permission")
    return where


def _when(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(str(text))
    except ValueError:
        raise InvalidInput(f"not a date and time: {str(text)[:40]!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)

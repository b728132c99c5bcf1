"""Who may do what: authentication (basic auth, a one-time login token, or the host app's own
callable), permissions, and the CSRF token. The dashboard is closed by default: with no
``auth`` every page answers 401."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from starlette.requests import Request

from leaseq.errors import InvalidInput

#: The actions a permission can grant ("pause" covers pausing and resuming a schedule).
#: Reading is granted by being let in at all.
ACTIONS = frozenset({"requeue", "cancel", "delete", "edit", "pause"})
#: What each kind of POST form may ask: its ``action`` field (absent: "") → the permission that
#: needs. A route honours only its own kind's actions: a form that names another route's
#: action is refused, never checked against that action's permission.
BULK_ASKS = {"requeue": "requeue", "cancel": "cancel", "delete": "delete"}
EDIT_ASKS = {"": "edit"}
SCHEDULE_ASKS = {"pause": "pause", "resume": "pause"}
SESSION_COOKIE = "leaseq_session"

#: ``auth(request)`` → the user's name, or None when the request is not signed in.
Auth = Callable[[Request], "str | None"]
#: What a user may do: ``"all"``, ``"read_only"``, a collection of ``ACTIONS``, or
#: ``"forbidden"`` (no page at all).
Grant = str | Collection[str]
#: ``permissions(user)`` → the user's grant; or one grant for everyone.
Permissions = Grant | Callable[[str], Grant]


class BasicAuth:
    """HTTP basic auth against a user → password mapping (compared in constant time). An
    empty user or password is refused: a header of just ``:`` would sign in."""

    def __init__(self, users: Mapping[str, str]):
        if not users or any(not user or ":" in user or not password
                            for user, password in users.items()):
            raise InvalidInput("basic auth needs at least one user, each with a name (no "
                               "colon) and a non-empty password")
        self.users = dict(users)

    def __call__(self, request: Request) -> str | None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        known = self.users.get(user)
        if known is None or not hmac.compare_digest(known.encode(), password.encode()):
            return None
        return user

    challenge = 'Basic realm="leaseq", charset="UTF-8"'


class LoginToken:
    """A one-time login URL (as Jupyter prints one): ``/login?token=…`` is honoured once and
    sets a session cookie; the token is then spent."""

    def __init__(self, token: str, user: str = "local"):
        self.token = token
        self.user = user
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def redeem(self, token: str) -> str | None:
        """A new session id for the right token, the first time only."""
        with self._lock:
            if not self.token or not hmac.compare_digest(token.encode(), self.token.encode()):
                return None
            self.token = ""
            session = secrets.token_urlsafe(32)
            self._sessions.add(session)
            return session

    def __call__(self, request: Request) -> str | None:
        session = request.cookies.get(SESSION_COOKIE, "")
        with self._lock:
            return self.user if session in self._sessions else None

    challenge = None


@dataclass(frozen=True)
class Access:
    user: str
    actions: frozenset[str]

    def may(self, action: str) -> bool:
        return action in self.actions

    @property
    def read_only(self) -> bool:
        return not self.actions


def resolve(permissions: Permissions, user: str) -> Access | None:
    """The user's access, or None when forbidden. Unknown grants are refused (closed)."""
    grant = permissions(user) if callable(permissions) else permissions
    if grant == "all":
        return Access(user, ACTIONS)
    if grant == "read_only":
        return Access(user, frozenset())
    if isinstance(grant, str) or grant is None:
        return None  # "forbidden", or anything unknown
    return Access(user, frozenset(grant) & ACTIONS)


def csrf_token(secret: bytes, user: str) -> str:
    return hmac.new(secret, f"csrf:{user}".encode(), hashlib.sha256).hexdigest()


def same_origin_post(request: Request) -> bool:
    """A browser says where a request comes from; a cross-site one is refused. A client that
    sends no ``Sec-Fetch-Site`` (curl, an old browser) still needs the CSRF token."""
    site = request.headers.get("sec-fetch-site")
    return site in (None, "same-origin", "none")

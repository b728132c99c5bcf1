"""The web dashboard: ``create_app(store, auth=…, permissions=…)`` is an ASGI app (Starlette
and Jinja2, one small script shipped here, no CDN, no build step). Needs the ``dashboard``
extra."""

from leaseq.dashboard.app import create_app
from leaseq.dashboard.security import BasicAuth, LoginToken

__all__ = ["BasicAuth", "LoginToken", "create_app"]

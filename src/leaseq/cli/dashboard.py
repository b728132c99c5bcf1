"""``leaseq dashboard``: serve the web dashboard (``leaseq.dashboard``) with uvicorn.

Closed by default: with no ``--user``/``--password`` (basic auth) it binds only to a loopback
address and prints a one-time login URL with a random token, as Jupyter does."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Any

import click

from leaseq.cli import errors, need_extra, open_store, url_option


@click.command()
@url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="No actions: every mutating request gets 403.")
@click.option("--user", envvar="LEASEQ_DASHBOARD_USER", default=None,
              help="Basic-auth user (env LEASEQ_DASHBOARD_USER).")
@click.option("--password", envvar="LEASEQ_DASHBOARD_PASSWORD", default=None,
              help="Basic-auth password (env LEASEQ_DASHBOARD_PASSWORD).")
@errors
def dashboard(url: str | None, host: str, port: int, read_only: bool, user: str | None,
              password: str | None) -> None:
    """Serve the web dashboard: queues, jobs, a job's story, quarantine, workers, health."""
    need_extra("dashboard", "the dashboard", "uvicorn", "leaseq.dashboard")
    import uvicorn

    from leaseq.dashboard import BasicAuth, LoginToken, create_app

    if (user is None) != (password is None):
        raise click.UsageError("give both --user and --password, or neither")
    if user == "" or password == "":  # an unset shell variable: a login anyone could give
        raise click.UsageError("--user and --password must not be empty")
    if user is None and not _loopback(host):
        raise click.UsageError("listening beyond loopback needs --user and --password")
    store = open_store(url, create=False)
    try:
        # Bound before the login URL is printed: it names the port really served (--port 0
        # picks one), and a port already taken is one line, not a URL that leads nowhere.
        listening = _listen(host, port)
        where = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
        served = f"http://{where}:{listening.getsockname()[1]}"
        auth: BasicAuth | LoginToken
        if user is not None and password is not None:
            auth = BasicAuth({user: password})
            click.echo(f"open {served}/ (basic auth, as {user})")
        else:
            auth = LoginToken(secrets.token_urlsafe(24))
            click.echo(f"open {served}/login?token={auth.token}")
        app = create_app(store, auth=auth, permissions="read_only" if read_only else "all")
        with listening:
            serve(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2),
                  listening)
    finally:
        store.close()


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn's own binding, done here so that its port is
    known first); a port that cannot be had is a usage error of one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise click.UsageError(f"cannot serve the dashboard on {host}:{port}: "
                               f"{exc.strerror or exc}") from None
    return sock


def serve(config: Any, listening: socket.socket) -> None:
    """Serve ``config``'s app on the bound socket until SIGINT / SIGTERM."""
    import uvicorn

    uvicorn.Server(config).run(sockets=[listening])


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


COMMANDS = [dashboard]

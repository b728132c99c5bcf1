"""``leaseq dashboard``: serve the web dashboard (``leaseq.dashboard``) with uvicorn.

Closed by default: with no ``--user``/``--password`` (basic auth) it binds only to a loopback
address and prints a one-time login URL with a random token, as Jupyter does."""

from __future__ import annotations

import ipaddress
import secrets

import click

from leaseq.cli import Failed, errors, open_store, url_option


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
    try:
        import uvicorn

        from leaseq.dashboard import BasicAuth, LoginToken, create_app
    except ImportError:
        raise Failed("the dashboard needs its extra: pip install 'leaseq[dashboard]'") from None
    if (user is None) != (password is None):
        raise click.UsageError("give both --user and --password, or neither")
    if user == "" or password == "":  # an unset shell variable: a login anyone could give
        raise click.UsageError("--user and --password must not be empty")
    store = open_store(url, create=False)
    permissions = "read_only" if read_only else "all"
    auth: BasicAuth | LoginToken
    if user is not None and password is not None:
        auth = BasicAuth({user: password})
    elif _loopback(host):
        auth = LoginToken(secrets.token_urlsafe(24))
        where = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
        click.echo(f"open http://{where}:{port}/login?token={auth.token}")
    else:
        raise click.UsageError("listening beyond loopback needs --user and --password")
    app = create_app(store, auth=auth, permissions=permissions)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
    finally:
        store.close()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


COMMANDS = [dashboard]

"""Scenario 9, secret canaries: a password in the database URL, secrets in payload fields and
secrets in the messages of exceptions handlers raise (a URL's password, ``token=``, a JSON
``api_key``, a Bearer token, a long hex token) → absent from the worker's log (at debug level),
the journal, the records' errors, the metrics output, the CLI's output and every error message
leaseq raises."""

from __future__ import annotations

import json
import secrets
import urllib.request
import uuid
from urllib.parse import urlsplit, urlunsplit

from click.testing import CliRunner

from leaseq import App, LeaseqError, connect
from leaseq.cli import cli
from leaseq.testing.chaos import Run, all_terminal, free_port, settle, wait_until

#: Forms of the ``leaky`` task's exception message (``chaos_tasks.LEAKS``) and how it raises.
LEAK_FORMS = ("url", "token", "json", "bearer", "hex")
LEAK_HOWS = ("raise", "retry", "permanent")


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    netloc = f"{user}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def run(r: Run) -> None:
    pw, secret = f"pwcanary{uuid.uuid4().hex}", f"paycanary{uuid.uuid4().hex}"
    # Handlers raise with these in their message; the hex one is a bare 48-digit token.
    leak, hex_leak = f"errcanary{uuid.uuid4().hex[:12]}", secrets.token_hex(24)
    # The server trusts local connections, so a password in the URL is carried but unused.
    url = _with_password(r.url, pw) if r.store_kind == "postgres" else r.url
    store = r.open(url)
    q = store.queue("chaos")
    jobs = {
        "c-retry": ("secretive", {"token": secret, "mode": "retry"}),
        "c-crash": ("secretive", {"token": secret, "mode": "crash"}),
        "c-perm": ("secretive", {"token": secret, "mode": "permanent"}),
        "c-echo": ("echo", {"password": secret, "nested": {"api_key": secret}}),
        "c-unknown-arg": ("work", {"n": 1, "token": secret}),
        "c-wrong-type": ("work", {"n": secret}),
        "c-no-task": ("no_such_task", {"token": secret}),
    }
    for form in LEAK_FORMS:
        for how in LEAK_HOWS:
            jobs[f"c-leak-{form}-{how}"] = ("leaky", {
                "secret": hex_leak if form == "hex" else leak, "form": form, "how": how})
    q.enqueue_many([q.spec(i, p, task=t, max_attempts=2) for i, (t, p) in jobs.items()])
    errors = _errors(r, q, secret, pw)
    ledger = r.ledger()
    port = free_port()
    worker = r.worker("w", url=url, log_level="debug", extra=["--metrics-port", str(port)])
    worker.start()
    finished = wait_until(all_terminal(q, list(jobs)), 60, 0.2)
    metrics = _scrape(port)
    worker.stop()
    r.check("all canary jobs finished", finished, str(q.counts()))
    journal = json.dumps([e.to_dict() for i in jobs for e in q.journal(i)])
    records = "\n".join(job.error or "" for job in map(q.get, jobs) if job is not None)
    cli_out = _cli_outputs(url, list(jobs))
    places = {"worker log": worker.output(), "journal": journal, "records' errors": records,
              "metrics": metrics, "error messages": "\n".join(errors), "CLI output": cli_out}
    r.check("the metrics were scraped", "leaseq_" in metrics, metrics[:200])
    r.check("the worker ran with the password in its URL", r.store_kind != "postgres"
            or "***" in worker.output() or pw not in worker.output())
    r.check("the leaky handlers failed with a masked error",
            all("***" in (job.error or "") for job in map(q.get, jobs)
                if job is not None and job.task == "leaky"), records[:300])
    canaries = (("password", pw), ("payload secret", secret), ("exception secret", leak),
                ("exception hex token", hex_leak))
    for where, text in places.items():
        for name, canary in canaries:
            r.check(f"{name} canary absent from {where}", canary not in text,
                    _around(text, canary))
    r.counts.jobs_in = len(jobs)
    settle(r, q, list(jobs), ledger, reruns_allowed=True,
           effect_expected=lambda j: j.task in ("echo", "secretive", "leaky"))


def _errors(r: Run, q, secret: str, pw: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The text of every error leaseq raises on inputs and URLs that carry a canary."""
    out: list[str] = []

    def expect(fn) -> None:  # type: ignore[no-untyped-def]
        try:
            fn()
        except LeaseqError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
        else:
            out.append("(no error)")

    expect(lambda: q.enqueue("c-echo", {"password": secret + "x"}, task="echo"))  # conflict
    expect(lambda: q.enqueue("e1", {"token": secret, "bad": float("nan")}))
    expect(lambda: q.enqueue("e2", {"token": secret, "pad": "x" * 2_000_000}))
    expect(lambda: q.enqueue("e3", {"status": secret}))
    expect(lambda: q.enqueue("e4", {"$where": secret}))
    app = App(store=q.store)

    @app.task(queue="chaos")
    def typed(n: int) -> None: ...

    expect(lambda: typed.enqueue(n=secret))
    expect(lambda: typed.enqueue(n=1, token=secret))
    for bad in (f"postgresql://postgres:{pw}@127.0.0.1:1/test?connect_timeout=2",
                f"postgresql://postgres:{pw}@127.0.0.1:5432/no_such_db",
                f"mysql://root:{pw}@127.0.0.1/x", f"sqlite:///nowhere/{uuid.uuid4().hex}/x.db"
                f"?password={pw}",
                f"postgresql://postgres@127.0.0.1:5432/test?bogus=1&password={pw}"):
        expect(lambda u=bad: connect(u).close())
    r.log("errors", count=len(out))
    return out


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()
    except OSError as exc:
        return f"(scrape failed: {exc})"


def _cli_outputs(url: str, ids: list[str]) -> str:
    runner = CliRunner()
    commands = [["status", "--url", url], ["status", "--url", url, "--json"],
                ["failed", "--url", url], ["failed", "--url", url, "--json"],
                ["migrate", "--url", url], ["sweep", "--url", url]]
    commands += [["inspect", i, "--url", url] for i in ids]
    return "\n".join(runner.invoke(cli, c).output for c in commands)


def _around(text: str, canary: str) -> str:
    at = text.find(canary)
    return "" if at < 0 else text[max(at - 150, 0):at + len(canary) + 50]

"""What the dashboard's tests share: a store with jobs in every state, XSS probes among them."""

from __future__ import annotations

import base64

from leaseq.stores.base import Store

W = "host:1:aaaa0001"
#: Job data that would run script if it were ever put into the page unescaped.
XSS = [
    "<script>window.__xss = 1</script>",
    '"><img src=x onerror="window.__xss=1">',
    "javascript:window.__xss=1",
    "'><svg onload=window.__xss=1>",
    "</textarea><script>window.__xss=1</script>",
]


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def given_jobs(store: Store) -> None:
    """mail: 3 pending, 2 failed (one with a secret in its payload), 1 done; xss: probes."""
    q = store.queue("mail")
    for i in range(3):
        q.enqueue(f"p-{i}", {"to": f"user{i}@example.com"}, task="send")
    for job_id, payload in (("f-1", {"token": "password=hunter2"}), ("f-2", {"n": 2})):
        q.enqueue(job_id, payload, task="send")
        q.fail(q.claim_one(job_id, W, lease_s=600), "SMTP 550 mailbox unavailable")  # type: ignore[arg-type]
    q.enqueue("d-1", {}, task="digest")
    q.complete(q.claim_one("d-1", W, lease_s=600), None)  # type: ignore[arg-type]
    x = store.queue("xss")
    for i, probe in enumerate(XSS):
        x.enqueue(f"x{i}-{probe}", {"note": probe}, task=probe)
        x.fail(x.claim_one(f"x{i}-{probe}", W, lease_s=600), probe)  # type: ignore[arg-type]
    store.register_worker(W, ["mail"], 0)
    store.register_schedule("nightly-digest", "mail", '{"every_s":86400,"task":"digest"}')

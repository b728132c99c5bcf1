"""The example's leaseq App and tasks (the worker runs these)."""

from __future__ import annotations

import os

import leaseq

app = leaseq.App(url=os.environ.get("LEASEQ_URL", "sqlite:///fastapi-example.db"))


@app.task(queue="reports", max_attempts=3)
def build_report(customer_id: int, month: str, pages: int = 1) -> dict[str, object]:
    """Pretend to build a monthly report."""
    return {"customer_id": customer_id, "month": month, "pages": pages}

"""An app for the CLI tests (``--app cli_tasks:app`` / ``leaseq worker cli_tasks:app``)."""

from __future__ import annotations

import leaseq

app = leaseq.App()


@app.task(queue="images")
def resize(path: str, width: int = 256) -> dict:
    return {"path": path, "width": width}

"""The demo's count: what happened, read back from the store (records and journals) and the
effect ledger — never from what the demo expects — then checked against what the producer
sent and what each image's fate allows."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from leaseq.demo.tasks import DONE, expected_endings
from leaseq.job import Job, JournalEntry, is_terminal

if TYPE_CHECKING:
    from leaseq.demo.run import DemoRun

Journals = dict[tuple[str, str], list[JournalEntry]]
"""(queue, job id) → the job's journal."""
Expected = dict[tuple[str, str], frozenset[str]]
"""(queue, job id) → the endings that job may have."""
EXAMPLES = 5
"""Jobs named in ``unexpected`` at most."""


def summarize(run: DemoRun, elapsed_s: float) -> dict[str, Any]:
    """The run's summary: jobs by outcome, retries, reclaims, effects, losses, endings its fate
    does not allow, the run's own facts (the replay, the killed worker, the time it took), and
    ``failed_checks``: empty when the run is right (the exit status is non-zero otherwise)."""
    jobs, journals = _read_back(run)
    finished = sum(1 for j in jobs if is_terminal(j.status))
    expected = _expected(run, jobs)
    unexpected = _unexpected(jobs, expected)
    summary = {
        "jobs": len(jobs),
        **_outcomes(jobs),
        **_retries(journals),
        "reclaimed": sum(_expired_attempts(events) for events in journals.values()),
        **_ledger(run.effects_path, journals),
        "done_without_effect": _done_without_effect(run, jobs),
        "lost": _lost(jobs, expected),
        "unexpected_endings": len(unexpected),
        "unexpected": unexpected[:EXAMPLES],
        "replay": run.replay or {},
        "killed_worker": run.killed,
        "workers_started": len(run.processes),
        "elapsed_s": round(elapsed_s, 2),
        "jobs_per_s": round(finished / elapsed_s, 1) if elapsed_s else 0.0,
        "store": run.url if run.config.url else "sqlite (temporary file)",
        "folder": run.folder if run.config.keep else None,
    }
    return {**summary, "failed_checks": failed_checks(summary)}


def failed_checks(s: dict[str, Any]) -> list[str]:
    """The checks the run failed, as ``name count``; empty when every one passed."""
    failed = [f"{name.replace('_', ' ')} {s[name]}" for name in
              ("lost", "duplicate_effects", "done_without_effect", "unexpected_endings")
              if s[name]]
    if set(s["replay"]) != {"unchanged"}:  # a replay must create and change nothing
        failed.append(f"replay not all unchanged ({_shown(s['replay']) or 'not run'})")
    return failed


def _read_back(run: DemoRun) -> tuple[list[Job], Journals]:
    queues = (run.fetch_q, run.thumb_q)
    jobs = [j for q in queues for j in q.iter_jobs()]
    journals = {(q.name, j.id): q.journal(j.id) for q in queues for j in jobs
                if j.queue == q.name}
    return jobs, journals


def _outcomes(jobs: list[Job]) -> dict[str, Any]:
    reasons = Counter(j.failure for j in jobs if j.status == "failed")
    return {"done": sum(1 for j in jobs if j.status == "done"),
            "quarantined": sum(reasons.values()),
            "quarantined_by_reason": dict(sorted(reasons.items()))}


def _retries(journals: Journals) -> dict[str, int]:
    """Jobs retried at least once, and retries in all."""
    per_job = [sum(1 for e in events if e.event == "retry_scheduled")
               for events in journals.values()]
    return {"retried": sum(1 for n in per_job if n), "retries": sum(per_job)}


def _expected(run: DemoRun, jobs: list[Job]) -> Expected:
    """Every job the run must end with, and the endings each may have: the fetch jobs the
    producer sent, the jobs for the renamed task, and the thumbnail of every done fetch."""
    fetch, thumb = run.fetch_q.name, run.thumb_q.name
    expected = {(fetch, s): expected_endings(s) for s in run.sources}
    expected.update({(fetch, job_id): frozenset({"failed(invalid)"})
                     for job_id in run.legacy_ids})
    expected.update({(thumb, f"thumb:{j.id}"): DONE for j in jobs
                     if j.queue == fetch and j.status == "done"})
    return expected


def _ending(job: Job) -> str:
    return f"failed({job.failure})" if job.status == "failed" else job.status


def _lost(jobs: list[Job], expected: Expected) -> int:
    """Jobs not terminal, and expected jobs missing from their queue (a fetch the store
    acknowledged but never wrote, a done fetch whose thumbnail job was never made)."""
    live = sum(1 for j in jobs if not is_terminal(j.status))
    present = {(j.queue, j.id) for j in jobs}
    return live + sum(1 for key in expected if key not in present)


def _unexpected(jobs: list[Job], expected: Expected) -> list[str]:
    """Finished jobs whose ending their fate does not allow (a healthy job quarantined), and
    jobs nobody expected, each as ``id ended …, expected …``."""
    return [f"{j.id} ended {_ending(j)}, expected {' or '.join(sorted(allowed)) or 'none'}"
            for j in jobs if is_terminal(j.status)
            and _ending(j) not in (allowed := expected.get((j.queue, j.id), frozenset()))]


def _done_without_effect(run: DemoRun, jobs: list[Job]) -> int:
    """Done jobs with no effect under their effect key: marked done, but their work was never
    made (a done fetch has its download, a done thumbnail its thumbnail)."""
    kinds = {run.fetch_q.name: "download", run.thumb_q.name: "thumbnail"}
    made = _effect_keys(run.effects_path)
    return sum(1 for j in jobs if j.status == "done" and j.effect_key(kinds[j.queue]) not in made)


def _effect_keys(path: str) -> set[str]:
    if not os.path.exists(path):
        return set()
    with sqlite3.connect(path) as db:
        return {key for (key,) in db.execute("SELECT key FROM effects")}


_ENDS_ATTEMPT = {"result_saved", "retry_scheduled", "snoozed", "given_back", "quarantined",
                 "cancelled"}


def _expired_attempts(events: list[JournalEntry]) -> int:
    """Attempts that ended because their lease ran out (the worker died): a ``reclaimed`` or
    ``quarantined (expired)`` event, or a claim that took over an attempt that never ended."""
    count = 0
    open_attempt = False
    for e in events:
        if e.event == "claimed":
            count += open_attempt  # the previous attempt never ended: its lease expired
            open_attempt = True
        elif e.event == "reclaimed" or (e.event == "quarantined"
                                        and (e.reason or "").startswith("expired")):
            count += open_attempt
            open_attempt = False
        elif e.event in _ENDS_ATTEMPT:
            open_attempt = False
    return count


def _ledger(path: str, journals: Journals) -> dict[str, int]:
    """Effects made, repeats absorbed by the effect key, and real duplicates.

    A repeat is legitimate when the attempt that made the effect first never finished (it was
    killed, or lost its lease): the job had to run again. It is a duplicate when that first
    attempt *did* finish the job — the work ran after it was done — or when one subject got the
    same kind of effect under two different keys (a replay that made a second job).
    """
    if not os.path.exists(path):
        return {"effects": 0, "repeated_effects_absorbed": 0, "duplicate_effects": 0}
    finished_epochs = {(job_id, e.lease_epoch) for (_, job_id), events in journals.items()
                       for e in events if e.event == "result_saved"}
    with sqlite3.connect(path) as db:
        effects = db.execute("SELECT count(*) FROM effects").fetchone()[0]
        twice_by_subject = db.execute(
            "SELECT count(*) FROM (SELECT kind, subject FROM effects GROUP BY kind, subject "
            "HAVING count(*) > 1)").fetchone()[0]
        repeats = db.execute(
            "SELECT e.job_id, e.lease_epoch, r.lease_epoch FROM effect_repeats r "
            "JOIN effects e ON e.key = r.key").fetchall()
    after_finish = sum(1 for job_id, first, again in repeats
                       if (job_id, first) in finished_epochs or first == again)
    return {"effects": effects, "repeated_effects_absorbed": len(repeats) - after_finish,
            "duplicate_effects": twice_by_subject + after_finish}


def print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title="leaseq demo — summary", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for row in _summary_rows(s):
        table.add_row(*row)
    console.print(table)
    if s["failed_checks"]:
        console.print(f"[bold red]FAILED: {'; '.join(s['failed_checks'])}[/bold red]")
    else:
        console.print("[bold green]lost 0, duplicate effects 0, done without effect 0, "
                      "unexpected endings 0[/bold green]")


def _shown(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    by_reason = _shown(s["quarantined_by_reason"]) or "none"
    killed = s["killed_worker"] or {}
    unexpected = "; ".join(s["unexpected"]) + (" …" if s["unexpected_endings"] > EXAMPLES
                                               else "")
    rows = [
        ("jobs", f"{s['jobs']} (fetch → thumbnail)"),
        ("done", str(s["done"])),
        ("retried", f"{s['retried']} jobs ({s['retries']} retries)"),
        ("quarantined", f"{s['quarantined']} ({by_reason})"),
        ("reclaimed", f"{s['reclaimed']} (worker pid {killed.get('pid')} SIGKILLed holding "
                      f"{killed.get('held')} job(s))"),
        ("replayed batch", _shown(s["replay"]) or "not run"),
        ("effects", f"{s['effects']} made, {s['repeated_effects_absorbed']} repeats absorbed "
                    "by their effect key"),
        ("duplicate effects", str(s["duplicate_effects"])),
        ("done without effect", str(s["done_without_effect"])),
        ("unexpected endings", f"{s['unexpected_endings']}" + (f" ({unexpected})"
                                                                if unexpected else "")),
        ("lost", str(s["lost"])),
        ("elapsed", f"{s['elapsed_s']:.1f} s ({s['jobs_per_s']} jobs/s)"),
    ]
    if s["folder"]:
        rows.append(("kept", f"{s['folder']} (demo.db, effects.db, worker logs)"))
    return rows

"""The diagnostic map as checks: symptom → likely cause → the check that was run → the action.

One set of checks behind ``leaseq doctor`` and the dashboard's health page (DESIGN.md §8).
Each reads through the store protocol only, with bounded queries; a finding names its queue
and a ``leaseq`` command to run next. A check that finds nothing wrong gives no finding.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from leaseq.browse import HourlyCount, JobFilter, QueueSummary
from leaseq.job import Job, JournalEntry
from leaseq.journal import JournalEvent
from leaseq.limits import HeldBack
from leaseq.stores.base import Store


@dataclass(frozen=True, slots=True)
class DoctorConfig:
    live_worker_s: float = 60.0
    """A worker is live when its registry beat is younger than this. Defaults to 60 s (six
    registry beats)."""
    oldest_ready_s: float = 300.0
    """Ready work older than this is a finding. Defaults to 5 minutes."""
    unpublished_s: float = 60.0
    """Broker mode: a due job still owed a publish after this long. Defaults to 60 s."""
    unclaimed_s: float = 600.0
    """Broker mode: a job published this long ago and still pending. Defaults to 10 min."""
    clock_skew_s: float = 2.0
    """The database clock and this host's may differ by this much. Defaults to 2 s."""
    dead_share: float = 0.2
    """PostgreSQL: a table whose dead rows are more than this share of its rows is bloated.
    Defaults to 20 % (autovacuum's own default trigger)."""
    dead_rows: int = 10_000
    """...and that has at least this many dead rows (a small table is vacuumed in a blink).
    Defaults to 10,000."""
    index_bloat_share: float = 0.5
    """PostgreSQL: an index whose estimated bloat is more than this share of its size is
    bloated. Defaults to 50 % (a btree under random inserts settles near 25 % by the same
    estimate, which is itself a few % off)."""
    index_min_bytes: int = 8_000_000
    """...and that is at least this large (a small index is read, and rebuilt, in a blink).
    Defaults to 8 MB."""
    broker: bool = False
    """Run the broker checks on every queue. Defaults to False: they run on a queue whose
    journal shows a publish in the hour now running (a dispatcher that died before it shows
    none: pass ``--broker``)."""


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """What the checks of one queue read, each read once: bounded counts, live leases, the
    journal of the hour now running, and the ready jobs its limits hold back."""

    queue: str
    summary: QueueSummary
    in_flight: int
    hour: list[HourlyCount]
    held_back: HeldBack = field(default_factory=HeldBack)

    def events(self, name: str) -> int:
        return sum(c.count for c in self.hour if c.event == name)


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    queue: str | None
    symptom: str
    cause: str
    ran: str
    """The check that was run, in words."""
    action: str
    """What to do next: a ``leaseq`` command."""
    severity: str = "fail"
    """``fail`` (the exit status says so) or ``warn``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(f.severity == "fail" for f in self.findings)


def diagnose(store: Store, config: DoctorConfig | None = None,
             local_clock: Callable[[], float] = time.time) -> Report:
    """Run every check on every queue of ``store``."""
    config = config or DoctorConfig()
    report = Report()
    now = store.server_now()
    live = {q for w in store.list_workers()
            if (now - w.last_beat_at).total_seconds() < config.live_worker_s for q in w.queues}
    report.checks_run.append("clock")
    report.findings.extend(check_clock(now.timestamp(), local_clock(), config))
    report.checks_run.append("schema")
    report.findings.extend(check_schema_version(store))
    report.checks_run.append("bloat")
    report.findings.extend(check_bloat(store, config))
    report.checks_run.append("index_bloat")
    report.findings.extend(check_index_bloat(store, config))
    limited = store.limited_queues()
    for queue in store.queues():
        facts = QueueFacts(queue, store.queue_summary(queue), store.in_flight(queue),
                           store.journal_hourly(queue, 1),
                           store.held_back(queue) if queue in limited else HeldBack())
        for name, check in QUEUE_CHECKS:
            report.checks_run.append(f"{name}:{queue}")
            report.findings.extend(check(store, facts, config, live))
    return report


def check_clock(db_now_s: float, local_now_s: float, config: DoctorConfig) -> list[Finding]:
    skew = db_now_s - local_now_s
    if abs(skew) <= config.clock_skew_s:
        return []
    return [Finding(
        "clock", None, f"the database clock is {skew:+.1f} s from this host's",
        "a host without time sync: leases and not-before are written by the database clock, "
        "while this host's logs and timeouts use its own",
        f"server_now against this host's clock (allowed ±{config.clock_skew_s} s)",
        "enable time sync (chrony / systemd-timesyncd) on both hosts, then run `leaseq doctor`")]


def check_ready_without_worker(store: Store, facts: QueueFacts, config: DoctorConfig,
                               live: set[str]) -> list[Finding]:
    queue, ready = facts.queue, facts.summary.ready
    if ready.n == 0 or queue in live:
        return []
    return [Finding(
        "ready_without_worker", queue, f"{ready} job(s) ready and no live worker serves {queue}",
        "no worker runs for this queue, or its workers stopped beating (killed, hung, cut off)",
        f"ready_stats and the worker registry (a beat within {config.live_worker_s:.0f} s)",
        f"leaseq worker MODULE:APP --queue {queue}")]


def check_oldest_ready(store: Store, facts: QueueFacts, config: DoctorConfig,
                       live: set[str]) -> list[Finding]:
    queue, age_s = facts.queue, facts.summary.oldest_ready_s
    if facts.summary.ready.n == 0 or age_s <= config.oldest_ready_s:
        return []
    ready, held = facts.summary.ready, facts.held_back.total
    if facts.held_back.by_rate or (ready.exact and held >= ready.n):
        # The limits at work, which more workers would not change: every ready job waits for
        # a key's slot, or the backlog is more than the rate lets through in a second (the
        # oldest then waits its turn however many workers run). (Past the count's cap, held
        # back by keys may be the cap too while thousands more wait for no limit: reported,
        # with the held count.)
        return []
    held_words = f" ({held} of the ready jobs held back by limits)" if held else ""
    return [Finding(
        "oldest_ready", queue, f"the oldest ready job has waited {age_s:.0f} s{held_words}",
        "too few workers for the rate of work, or workers busy with slow jobs",
        f"ready_stats: oldest ready age over {config.oldest_ready_s:.0f} s",
        f"leaseq status --queue {queue}  (then start more: leaseq worker MODULE:APP "
        f"--queue {queue})")]


def check_expired_leases(store: Store, facts: QueueFacts, config: DoctorConfig,
                         live: set[str]) -> list[Finding]:
    queue, lapsed = facts.queue, facts.summary.lapsed
    if lapsed.n <= 0:
        return []
    more = "" if lapsed.exact else " or more"
    return [Finding(
        "expired_leases", queue, f"{lapsed.n}{more} job(s) hold a lease that ran out and was "
        "not reclaimed", "workers die or hang faster than a sweeper reclaims their jobs "
        "(no sweeper runs, or the lease is shorter than the work between heartbeats)",
        "queue_summary: processing jobs whose lease ran out",
        f"leaseq sweep --queue {queue}")]


def check_quarantine_growth(store: Store, facts: QueueFacts, config: DoctorConfig,
                            live: set[str]) -> list[Finding]:
    queue, grew = facts.queue, facts.events(JournalEvent.QUARANTINED)
    if not grew:
        return []
    return [Finding(
        "quarantine_grew", queue, f"{grew} job(s) quarantined this hour",
        "a permanent error (bad input, a changed API) or a dependency down past the retries",
        "journal events 'quarantined' counted for the hour now running",
        f"leaseq failed --queue {queue}", severity="warn")]


def check_outbox(store: Store, facts: QueueFacts, config: DoctorConfig,
                 live: set[str]) -> list[Finding]:
    queue = facts.queue
    if not (config.broker or facts.events(JournalEvent.PUBLISHED)):
        return []
    now = store.server_now()
    owed = [j for j in store.outbox_due(queue, 100)
            if j.lease_until is not None
            and (now - j.lease_until).total_seconds() > config.unpublished_s]
    if not owed:
        return []
    return [Finding(
        "outbox_owed", queue, f"{len(owed)} due job(s) owed to the broker for over "
        f"{config.unpublished_s:.0f} s", "the dispatcher is not running, or cannot reach "
        "RabbitMQ (no confirms)", "outbox_due: due jobs with no publish marked",
        f"leaseq dispatch --amqp-url AMQP_URL --queue {queue}")]


def check_published_unclaimed(store: Store, facts: QueueFacts, config: DoctorConfig,
                              live: set[str]) -> list[Finding]:
    queue = facts.queue
    if not (config.broker or facts.events(JournalEvent.PUBLISHED)):
        return []
    now = store.server_now()
    before = now - timedelta(seconds=config.unclaimed_s)
    page = store.find_jobs(JobFilter(queue, status="pending", updated_until=before), limit=100)
    stuck = [j for j in page.jobs if j.published_at is not None and j.published_at < before]
    if not stuck:
        return []
    return [Finding(
        "published_unclaimed", queue, f"{len(stuck)} job(s) published over "
        f"{config.unclaimed_s:.0f} s ago and never claimed", "the message was lost (a purged "
        "or deleted broker queue, a wrong binding) or no consumer runs",
        "pending jobs with published_at older than the threshold",
        f"leaseq rabbitmq republish --queue {queue} --older-than-s {config.unclaimed_s:.0f}")]


def check_schema_version(store: Store) -> list[Finding]:
    """The schema this code expects against the one the database holds, read with
    ``schema_version`` (never ``migrate``: doctor and a read-only dashboard write nothing)."""
    expected = _latest_migration(store)
    if expected is None:  # a store that ships no migrations has no version to compare
        return []
    found = store.schema_version()
    if found == expected:
        return []
    ran = "schema_version() against the migrations shipped with this leaseq"
    if found is not None and found > expected:
        return [Finding(
            "schema", None, f"the database schema is version {found}, this leaseq expects "
            f"{expected}", "the database was migrated by a newer leaseq than this host runs",
            ran, "upgrade leaseq on this host, then `leaseq migrate`")]
    held = "no leaseq schema" if found is None else f"schema version {found}"
    return [Finding(
        "schema", None, f"the database holds {held}, this leaseq expects {expected}",
        "the database was not migrated since this leaseq was installed", ran,
        "`leaseq migrate`, then `leaseq doctor`")]


def check_bloat(store: Store, config: DoctorConfig) -> list[Finding]:
    """PostgreSQL: dead rows left by updates that vacuum has not reclaimed yet. Every state
    change of a job writes a new row version, so a jobs table vacuum cannot keep up with grows
    and slows every claim. Indexes: ``check_index_bloat``."""
    return [Finding(
        "bloat", None, f"table {t.table}: {t.dead_rows:,} dead rows, {t.dead_share:.0%} of "
        f"its rows ({t.size_bytes / 1e6:.0f} MB with indexes)",
        "autovacuum falls behind the table's updates (long transactions holding old rows, "
        "or a scale factor too high for a hot table)",
        f"pg_stat_user_tables: dead rows over {config.dead_share:.0%} and "
        f"{config.dead_rows:,}", f"VACUUM (ANALYZE) on {t.table}, then `leaseq doctor`; if it "
        "returns, lower autovacuum_vacuum_scale_factor for that table")
        for t in store.table_health()
        if t.dead_rows >= config.dead_rows and t.dead_share > config.dead_share]


def check_index_bloat(store: Store, config: DoctorConfig) -> list[Finding]:
    """PostgreSQL: index pages that deleted and updated jobs emptied. Vacuum removes their
    entries but a btree keeps a page that still holds one, so the index stays as large as its
    busiest hour and every claim reads more of it. An estimate from the statistics (see
    ``index_health``), hence a warning."""
    return [Finding(
        "index_bloat", None, f"index {i.index} on {i.table}: about {i.bloat_share:.0%} of its "
        f"{i.size_bytes / 1e6:.0f} MB is bloat (estimated)",
        "deletes and updates left its pages mostly empty, and vacuum gives back only the "
        "pages it empties entirely",
        f"btree size against the size its rows need (pg_class, pg_stats): over "
        f"{config.index_bloat_share:.0%} estimated bloat in an index of "
        f"{config.index_min_bytes / 1e6:g} MB or more",
        f"REINDEX INDEX CONCURRENTLY {i.schema}.{i.index}, then `leaseq doctor`",
        severity="warn")
        for i in store.index_health()
        if i.size_bytes >= config.index_min_bytes and i.bloat_share > config.index_bloat_share]


def _latest_migration(store: Store) -> int | None:
    from leaseq.stores.sql import latest_migration

    package = type(store).__module__.rpartition(".")[0]
    try:
        return latest_migration(package)
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, IndexError):
        return None  # no migrations folder, or an empty one


# --- one job's story: the diagnostic map of the reference design, read from its journal -------


def diagnose_job(job: Job, journal: Sequence[JournalEntry], now: datetime,
                 config: DoctorConfig | None = None) -> list[Finding]:
    """The map's rows for one job id, checked against its journal (the dashboard's job page):
    a result saved with no ack after it, retries that keep failing for the same reason, a job
    waiting long in broker mode with no publish."""
    config = config or DoctorConfig()
    events = [e.event for e in journal]
    found: list[Finding] = []
    if JournalEvent.RECEIVED in events and events[-1] == JournalEvent.RESULT_SAVED:
        found.append(Finding(
            "result_without_ack", job.queue, "the result is saved but no ack_sent follows it",
            "the connection dropped between the durable result and the ack",
            "the order of result_saved and ack_sent in the job's journal",
            "nothing to redo: a redelivery reads the terminal state and only acks",
            severity="warn"))
    reasons = [e.reason for e in journal if e.event == JournalEvent.RETRY_SCHEDULED]
    if len(reasons) >= 2 and len(set(reasons[-2:])) == 1:
        found.append(Finding(
            "same_reason_retried", job.queue, f"{len(reasons)} retries, the last ones for the "
            "same reason", "an error no retry will fix is treated as transient",
            "retry_scheduled reasons in the job's journal",
            # Quoted for a shell: an id may hold anything, and an operator pastes this
            "raise leaseq.Permanent for it in the task; then "
            f"`leaseq cancel --queue {job.queue} {shlex.quote(job.id)}` or fix the payload "
            "and requeue", severity="warn"))
    waited = (now - job.updated_at).total_seconds() if job.updated_at else 0.0
    if (job.status == "pending" and job.published_at is None
            and JournalEvent.PUBLISHED in events and waited > config.unpublished_s):
        found.append(Finding(
            "queued_unpublished", job.queue, f"pending for {waited:.0f} s with no publish",
            "the outbox dispatcher is not running, or its route is wrong",
            "published_at and the publish events in the job's journal",
            f"leaseq dispatch --amqp-url AMQP_URL --queue {job.queue}"))
    return found


Check = Callable[[Store, QueueFacts, DoctorConfig, set[str]], list[Finding]]
QUEUE_CHECKS: list[tuple[str, Check]] = [
    ("ready_without_worker", check_ready_without_worker),
    ("oldest_ready", check_oldest_ready),
    ("expired_leases", check_expired_leases),
    ("quarantine_grew", check_quarantine_growth),
    ("outbox_owed", check_outbox),
    ("published_unclaimed", check_published_unclaimed),
]

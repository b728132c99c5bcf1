"""Errors a user of leaseq can meet.

Every error says what to do about it and never echoes a password or a whole payload.
"""

from __future__ import annotations


class LeaseqError(Exception):
    """Base class of every error leaseq raises on purpose."""


class InvalidInput(LeaseqError, ValueError):
    """Something given to leaseq was refused before anything was written."""


class InvalidJobId(InvalidInput):
    """A job id is empty, not a string, or longer than 512 bytes in UTF-8."""


class InvalidQueueName(InvalidInput):
    """A queue name does not match ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``."""


class InvalidPayload(InvalidInput):
    """A payload is not a JSON object leaseq can store and give back unchanged."""


class InvalidPolicy(InvalidInput):
    """A queue policy has an unknown key or a value out of range."""


class InvalidURL(InvalidInput):
    """A store URL cannot be used. The message shows the URL with its password masked."""


class ScheduleConflict(InvalidInput):
    """A schedule's name is taken, in the ledger, by an active schedule of a queue this app
    does not use: most likely another app sharing the database. Schedule names are global
    in the ledger; give this one another ``schedule_name``. Nothing was written."""

    def __init__(self, name: str, queue: str):
        self.name = name
        self.queue = queue
        super().__init__(
            f"schedule {name!r} is already active in queue {queue!r}, which this app does not "
            "use (another app on the same database?); nothing was written: give this "
            "schedule another schedule_name")


class JobConflict(LeaseqError):
    """The same job id was enqueued again, without a revision, with a different payload.

    Pass ``on_conflict="keep"`` to keep the stored job, or ``"replace"`` to replace its payload,
    or give a ``revision`` so leaseq can tell a new version from a replay.
    """

    def __init__(self, queue: str, job_ids: list[str]):
        self.queue = queue
        self.job_ids = job_ids
        shown = ", ".join(repr(i[:80]) for i in job_ids[:5])
        more = f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else ""
        super().__init__(
            f"queue {queue!r}: job id {shown}{more} already exists with a different payload "
            "and no revision; nothing of this batch was written. Pass on_conflict='keep' or "
            "'replace', or give a revision."
        )


class JobNotFound(LeaseqError, LookupError):
    """No job with this id in this queue."""

    def __init__(self, queue: str, job_id: str):
        self.queue = queue
        self.job_id = job_id
        super().__init__(f"queue {queue!r} has no job {job_id[:200]!r}")


class PayloadMismatch(InvalidPayload):
    """A payload does not fit its task's signature (a missing, unknown or mistyped argument).
    Also importable from ``leaseq.app``."""


class LeaseLost(LeaseqError):
    """The lease was taken by another claim (or the job was cancelled): nothing was written.
    Also importable from ``leaseq.job``."""

    def __init__(self, queue: str, job_id: str, lease_epoch: int):
        self.queue = queue
        self.job_id = job_id
        self.lease_epoch = lease_epoch
        super().__init__(
            f"queue {queue!r}: lease on job {job_id[:200]!r} (epoch {lease_epoch}) is no longer "
            "held; the write was refused"
        )


class StoreUnavailable(LeaseqError):
    """The store could not be reached (or was lost). The message never holds a password."""


class StoreRefused(StoreUnavailable):
    """The database refused leaseq's statement for a reason of its own: a table, column or
    function of the store's schema is missing (dropped or renamed by hand), or the role lacks
    a privilege on it. Nothing was written. Raised at once, not retried; a worker keeps trying
    as it does while a store is unavailable, so fixing the schema or the grants is enough."""


class StoreNotFound(LeaseqError, LookupError):
    """``connect(url, create=False)`` found no leaseq store at the URL (a SQLite file that does
    not exist or holds no leaseq tables, a PostgreSQL schema or a MongoDB database without
    them), and created nothing. Often a mistyped URL."""

    def __init__(self, url: str):
        self.url = url
        super().__init__(
            f"no leaseq store at {url}; nothing was created there. Check the URL; to create "
            "the store there, run `leaseq migrate` with this URL (a worker or an enqueue "
            "creates it too)"
        )


class StoreNotMigrated(LeaseqError):
    """``connect(url, create=False)`` found a leaseq schema older than this leaseq: it is left
    as it is (reading it with newer code could fail halfway) until ``leaseq migrate``."""

    def __init__(self, url: str, found: int, expected: int):
        self.url = url
        self.found = found
        self.expected = expected
        super().__init__(
            f"the leaseq store at {url} holds schema version {found}, older than this "
            f"leaseq's {expected}; it was left as it is. Upgrade it with `leaseq migrate` "
            "(a worker of this leaseq upgrades it too)"
        )


class MigrationRefused(LeaseqError):
    """The store's schema had to be created or upgraded and the database refused it: the URL's
    role may not create there. Nothing was changed. Once a role that may (the schema's owner)
    runs ``leaseq migrate``, a role that only reads and writes rows opens it as it is."""

    def __init__(self, url: str, reason: str):
        self.url = url
        super().__init__(
            f"cannot create or upgrade the leaseq store at {url}: {reason}; nothing was "
            "changed. Run `leaseq migrate` once with a role that may create there (the "
            "schema's owner); this URL then works as it is"
        )


class UnsupportedOperation(LeaseqError):
    """This store cannot do what was asked (for example a transaction on a standalone MongoDB)."""


class TopologyError(LeaseqError):
    """The broker's queues or exchanges are missing or were declared with other arguments."""


class BrokerUnavailable(LeaseqError):
    """RabbitMQ could not be connected to: nothing listens there, it refused the login, the
    vhost does not exist. The message names the URL (password masked) and the cause. A
    dispatcher or consumer keeps trying, as it does while a store is unavailable."""

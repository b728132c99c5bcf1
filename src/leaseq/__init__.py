"""leaseq: a durable job queue in which the job's database record is the job's state."""

from leaseq.app import App, Finish
from leaseq.deprecated import module_getattr
from leaseq.errors import (
    BrokerUnavailable,
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidPolicy,
    InvalidQueueName,
    InvalidURL,
    JobConflict,
    JobNotFound,
    LeaseLost,
    LeaseqError,
    MigrationRefused,
    PayloadMismatch,
    ScheduleConflict,
    StoreNotFound,
    StoreNotMigrated,
    StoreRefused,
    StoreUnavailable,
    TopologyError,
    UnsupportedOperation,
)
from leaseq.job import (
    EnqueueOutcome,
    EnqueueResult,
    Failure,
    Job,
    JobSpec,
    JobStatus,
    JournalEntry,
    Lease,
    Permanent,
    Retry,
    Snooze,
)
from leaseq.journal import JournalEvent
from leaseq.policy import QueuePolicy, backoff_s
from leaseq.queue import Queue
from leaseq.stores import connect
from leaseq.stores.base import Store

__version__ = "0.1.0"

__getattr__ = module_getattr(__name__, {"Outcome": "EnqueueOutcome"}, globals())

__all__ = [
    "App",
    "BrokerUnavailable",
    "EnqueueOutcome",
    "EnqueueResult",
    "Failure",
    "Finish",
    "InvalidInput",
    "InvalidJobId",
    "InvalidPayload",
    "InvalidPolicy",
    "InvalidQueueName",
    "InvalidURL",
    "Job",
    "JobConflict",
    "JobNotFound",
    "JobSpec",
    "JobStatus",
    "JournalEntry",
    "JournalEvent",
    "Lease",
    "LeaseLost",
    "LeaseqError",
    "MigrationRefused",
    "PayloadMismatch",
    "Permanent",
    "Queue",
    "QueuePolicy",
    "Retry",
    "ScheduleConflict",
    "Snooze",
    "Store",
    "StoreNotFound",
    "StoreNotMigrated",
    "StoreRefused",
    "StoreUnavailable",
    "TopologyError",
    "UnsupportedOperation",
    "__version__",
    "backoff_s",
    "connect",
]

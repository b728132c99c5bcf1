"""leaseq: a durable job queue in which the job's database record is the job's state."""

from leaseq.app import App, Finish
from leaseq.errors import (
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidPolicy,
    InvalidQueueName,
    InvalidURL,
    JobConflict,
    JobNotFound,
    LeaseqError,
    StoreUnavailable,
    UnsupportedOperation,
)
from leaseq.job import (
    EnqueueResult,
    Failure,
    Job,
    JobSpec,
    JobStatus,
    JournalEntry,
    Lease,
    LeaseLost,
    Outcome,
    Permanent,
    Retry,
    Snooze,
)
from leaseq.policy import QueuePolicy, backoff_s
from leaseq.queue import Queue
from leaseq.stores import connect
from leaseq.stores.base import Store

__version__ = "0.1.0"

__all__ = [
    "App",
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
    "Lease",
    "LeaseLost",
    "LeaseqError",
    "Outcome",
    "Permanent",
    "Queue",
    "QueuePolicy",
    "Retry",
    "Snooze",
    "Store",
    "StoreUnavailable",
    "UnsupportedOperation",
    "__version__",
    "backoff_s",
    "connect",
]

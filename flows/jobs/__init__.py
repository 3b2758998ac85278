"""The job definition API and the registry of jobs (see docs/how-to/write-a-job.md)."""

from flows.jobs.errors import (
    JobError,
    PermanentError,
    TransientError,
    UnknownJob,
    UnknownSubject,
    ValidationFailed,
    is_transient,
)
from flows.jobs.job import Candidate, Job, MissedRunPolicy
from flows.jobs.registry import (
    ENTRY_POINT_GROUP,
    get_job,
    register,
    registered_jobs,
    upgrade_ledger,
)

__all__ = [
    "ENTRY_POINT_GROUP", "Candidate", "Job", "JobError", "MissedRunPolicy", "PermanentError",
    "TransientError", "UnknownJob", "UnknownSubject", "ValidationFailed", "get_job",
    "is_transient", "register", "registered_jobs", "upgrade_ledger",
]

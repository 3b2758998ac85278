"""What a job author imports: the job definition and its budget, what its stages return, the
model it calls and the errors it raises (see docs/how-to/write-a-job.md). Operators find jobs by name and
upgrade the ledger through ``flows.registry``; every other error is in ``flows.errors``."""

from flows.errors import PermanentError, TransientError, ValidationFailed
from flows.jobs.approval import Approval
from flows.jobs.budget import Budget
from flows.jobs.job import Candidate, Job, MissedRunPolicy
from flows.model import Generation, Message, Model
from flows.targets import Target
from store import InvalidInput, OutboxMessage, Period, normalize_address

__all__ = [
    "Approval",
    "Budget",
    "Candidate",
    "Generation",
    "InvalidInput",
    "Job",
    "Message",
    "MissedRunPolicy",
    "Model",
    "OutboxMessage",
    "Period",
    "PermanentError",
    "Target",
    "TransientError",
    "ValidationFailed",
    "normalize_address",
]

"""The errors of flows, below the job API and the model clients that both raise them, rooted at
``store.RunledgerError``. How a job's failures are classified: a transient failure is retried
with backoff, anything else fails the Run for good (``ledger.fail(retryable=False)``) until an
operator requeues it."""

from __future__ import annotations

from store import InvalidInput, LeaseLost, RunledgerError


class JobError(RunledgerError):
    """A job failed."""


class TransientError(JobError):
    """A transient failure (timeout, rate limit, 5xx, lost connection); retrying may succeed."""

    retryable = True

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(JobError):
    """A failure that retrying cannot fix; the Run is marked failed."""


class ValidationFailed(PermanentError, InvalidInput):
    """The candidate output failed validation; nothing was persisted."""


class UnknownJob(InvalidInput):
    """No job is registered under that name."""


class UnknownSubject(InvalidInput):
    """The job has no such subject."""


class LeaseLapsed(LeaseLost):
    """This process could not renew the lease for longer than the lease lasts (the ledger
    unreachable): another attempt may hold the Run now, so this one stops where it is and
    leaves the Run to whichever attempt takes it over."""

    # The Run is not lost: once the lease expires, reconcile or the next tick takes it over.
    retryable = True


class InvalidJob(InvalidInput):
    """A job definition is invalid."""


def is_transient(error: BaseException) -> bool:
    """True for failures worth retrying: timeouts and connection errors, and every runledger
    error that says it is ``retryable`` (a busy or unreachable ledger, a job's own
    ``TransientError``); the ledger has already turned its driver's errors into those."""
    if isinstance(error, RunledgerError):
        return error.retryable
    return isinstance(error, TimeoutError | ConnectionError)


class DeliveryConfigurationError(RunledgerError):
    """A channel's transport is misconfigured (settings, a missing block, credentials or TLS);
    nothing was sent and the claimed messages were given back without counting an attempt."""


class PeriodNotDue(InvalidInput):
    """The period's occurrence is not due yet: a completed Run never changes, so running it
    early would lock in early content. Nothing was written."""


class NotReady(InvalidInput):
    """A tick cannot start: its model endpoint is unknown, or a block its targets name is
    missing or invalid. Nothing was written and no model call was paid."""

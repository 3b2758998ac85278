"""One exception root; each subclass says what went wrong and its docstring is the default message."""

from __future__ import annotations


class RunledgerError(Exception):
    """A runledger operation failed."""

    # True where trying the same operation again later can succeed (and is safe: every
    # transition is guarded by its fence or its state); the pipeline retries exactly these.
    retryable: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(RunledgerError, ValueError):
    """The input is invalid; nothing was written."""


class InvalidIdentity(InvalidInput):
    """A Run identity field is invalid."""


class InvalidPeriod(InvalidInput):
    """A period or cadence is invalid."""


class InvalidMessage(InvalidInput):
    """An outbox message is invalid (recipient, header or size)."""


class OutputTooLarge(InvalidInput):
    """The output is larger than the configured byte limit."""


class RunConflict(RunledgerError):
    """The Run already exists with different parameters; nothing was written."""


class RevisionInProgress(RunledgerError):
    """The Run has an unfinished revision already: at most one revision of a Run is pending or
    running at a time; wait for it to finish, or resume it."""


class RevisionRefused(RunledgerError):
    """This Run cannot be revised (only a completed Run can, and only by its job's current
    version, without a business effect); nothing was written."""


class RunNotFound(RunledgerError, LookupError):
    """No Run has that id."""


class MessageNotFound(RunledgerError, LookupError):
    """No outbox message has that id."""


class AmbiguousId(InvalidInput, LookupError):
    """The id prefix matches more than one row; give more of its characters."""


class OutputPruned(RunledgerError, LookupError):
    """The Run is completed but retention pruned its output (only its tombstone is left);
    nothing is recomputed: read the output from where its delivery went, or request a
    revision to compute it anew."""


class LeaseLost(RunledgerError):
    """The lease moved to another owner (the fence changed); this write changed nothing."""


class CreateInDoubt(RunledgerError):
    """Another batch of a provider without batch metadata has its create in doubt; this one
    is created once that is settled (nothing was sent)."""


class DeliveryLeaseLost(LeaseLost):
    """The delivery lease on this outbox message moved on; this write changed nothing."""


class InvalidTransition(RunledgerError):
    """The requested state change is not allowed from the current state."""


class LedgerBusy(RunledgerError):
    """The ledger stayed locked by other writers; retry later (nothing was written)."""

    retryable = True


class LedgerUnavailable(RunledgerError):
    """The ledger database dropped the connection or failed the statement for a reason that
    passes (a restart, a deadlock, a lost network); retry later."""

    retryable = True


class LedgerNotReady(RunledgerError):
    """No ledger at the configured URL, or its schema is behind: a flow run never creates or
    migrates one; set RUNLEDGER_DATABASE_URL to the deployment's ledger, or run `runledger db
    upgrade` against it."""


class LedgerError(RunledgerError):
    """The ledger database refused the statement (a missing schema, a constraint of a job's
    own tables); retrying will not help."""


class IdentityRace(RunledgerError):
    """Two workers inserted the same new Run at once and the database reported the loser's
    clash on the identity index; its statement wrote nothing and can run again."""

    retryable = True

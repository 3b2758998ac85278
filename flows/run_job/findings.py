"""What the ledger found for a subject, as its outcome: what register+claim found for its Run,
a Run the tick's batched read found finished, a lease lost to another attempt."""

from __future__ import annotations

from typing import Literal

from flows.errors import LeaseLapsed
from flows.run_job.outcomes import SubjectOutcome
from flows.run_job.stages import retried
from flows.run_job.tick import Tick
from store import (
    FinishedRun,
    LeaseLost,
    Registration,
    Run,
    RunIdentity,
    RunledgerError,
    params_fingerprint,
)

Finding = Literal["claimed", "duplicate", "in-progress-elsewhere", "conflict", "failed"]
FINDINGS: tuple[Finding, ...] = ("claimed", "duplicate", "in-progress-elsewhere", "conflict",
                                 "failed")


def finding(registration: Registration) -> Finding:
    """What register+claim found for one Run."""
    if registration.claim is not None:
        return "claimed"
    if registration.conflict is not None:
        return "conflict"
    if registration.run.status == "completed":
        return "duplicate"
    if registration.run.status == "failed":
        return "failed"
    return "in-progress-elsewhere"


def pruned_note(run: Run | FinishedRun) -> str | None:
    """What a tombstone says of its output, or None for a Run that still has it."""
    if run.pruned_at is None:
        return None
    return (f"pruned on {run.pruned_at.date().isoformat()}, output sha256 "
            f"{run.output_digest or '?'}")


def duplicate_outcome(subject: str, run: Run | FinishedRun) -> SubjectOutcome:
    """A completed Run asked for again: its stored output, or its tombstone's note."""
    return SubjectOutcome(subject, run.run_id, "duplicate", run.attempts, output=run.output,
                          pruned=pruned_note(run))


def describe(error: BaseException) -> str:
    """An error as outcomes and the ledger name it: its type, then its message."""
    return f"{type(error).__name__}: {error}"


def unclaimed_outcome(subject: str, registration: Registration) -> SubjectOutcome:
    """The outcome of a subject whose Run register+claim did not claim."""
    run = registration.run
    if registration.conflict is not None:
        return SubjectOutcome(subject, run.run_id, "failed", run.attempts,
                              error=describe(registration.conflict))
    found = finding(registration)
    if found == "failed":
        return failed_permanently(subject, run)
    if found == "duplicate":
        return duplicate_outcome(subject, run)
    # What on-call needs to decide whether to wait: who holds the Run, and until when.
    until = run.lease_expires_at.isoformat(timespec="seconds") if run.lease_expires_at else "?"
    return SubjectOutcome(subject, run.run_id, "in-progress-elsewhere", run.attempts,
                          error=f"leased by {run.owner} until {until}")


def finished_outcome(tick: Tick, subject: str, identity: RunIdentity,
                     run: FinishedRun) -> SubjectOutcome:
    """The outcome of a Run the batched read found finished."""
    if run.status == "failed":
        return failed_permanently(subject, run)
    params = tick.job.run_params(subject, tick.period)
    if params_fingerprint(params) != run.params_fingerprint:
        try:
            tick.ledger.register(identity, params)  # raises RunConflict and writes nothing
        except RunledgerError as exc:
            return SubjectOutcome(subject, run.run_id, "failed", run.attempts,
                                  error=describe(exc))
    return duplicate_outcome(subject, run)


def read_finished(tick: Tick, identities: dict[str, RunIdentity]
                  ) -> tuple[dict[str, SubjectOutcome], dict[str, RunIdentity]]:
    """The tick's finished Runs, read at once (retried like a stage: a tick may start while
    the ledger's server restarts), as emitted outcomes; and the subjects still to run."""
    finished = retried(lambda: tick.ledger.finished([i.run_id for i in identities.values()]),
                       tick.settings.task_retries, tick.settings.retry_delay_seconds)
    outcomes: dict[str, SubjectOutcome] = {}
    pending: dict[str, RunIdentity] = {}
    for subject, identity in identities.items():
        run = finished.get(identity.run_id)
        if run is None:
            pending[subject] = identity
        else:
            outcomes[subject] = tick.emit(finished_outcome(tick, subject, identity, run))
    return outcomes, pending


def failed_permanently(subject: str, run: Run | FinishedRun) -> SubjectOutcome:
    return SubjectOutcome(
        subject, run.run_id, "failed", run.attempts,
        error=f"failed permanently ({run.error}); requeue it with "
              f"`runledger runs requeue {run.run_id}`",
    )


def lapsed_outcome(subject: str, run: Run, error: LeaseLapsed) -> SubjectOutcome:
    """This attempt could not reach the ledger for longer than its lease: it failed, and asks
    the ledger nothing more; the Run stays leased until its lease expires and another attempt
    (reconcile, the next tick) takes it over."""
    return SubjectOutcome(subject, run.run_id, "failed", run.attempts, error=describe(error))


def lease_lost_outcome(tick: Tick, subject: str, run_id: str, error: LeaseLost) -> SubjectOutcome:
    """Another attempt holds the Run now: this one's candidate is gone, which is no failure."""
    return SubjectOutcome(subject, run_id, "lease-lost", tick.ledger.get(run_id).attempts,
                          error=str(error))

"""A scheduled tick that starts too late: a worker was down and its flow runs went Late, or a
slot's run waited days in a queue. Its job's missed-run policy decides whether it still runs:
``catch-up`` runs it, ``latest`` only if its period is the latest due one, ``skip`` records its
occurrences skipped and runs nothing. A deliberate run (an explicit period) is never stale."""

from __future__ import annotations

from datetime import datetime, timedelta

from flows.events import emit_decisions
from flows.jobs import Job
from flows.run_job.findings import duplicate_outcome, failed_permanently
from flows.run_job.outcomes import SubjectOutcome, TickReport
from flows.run_job.tick import Tick
from store import Period, RunIdentity


def stale_reason(job: Job, period: Period, expected_start: datetime,
                 now: datetime) -> str | None:
    """Why a scheduled tick of ``period``, expected at ``expected_start`` (its slot) and
    starting at ``now``, must not run, or None: it started more than ``max_lateness`` late and
    its policy is ``skip``, or ``latest`` while a later period is due. A run made now (a Quick
    run: expected now) is never late; a deliberate one (an explicit period) is never asked."""
    late = now - expected_start
    if late <= job.lateness_allowed or job.missed_runs == "catch-up":
        return None
    latest = job.latest_due_period(now)
    if job.missed_runs == "latest" and latest.start == period.start:
        return None
    why = ("missed-run policy skip" if job.missed_runs == "skip"
           else f"missed-run policy latest: superseded by {latest.label}")
    late = timedelta(seconds=int(late.total_seconds()))
    return (f"started {late} after its scheduled time, later than the job allows "
            f"({job.lateness_allowed}); {why}. To run it anyway: a Custom run with "
            f"period={period.label}, or `runledger backfill {job.name} --from {period.label} "
            f"--to {period.label} --reprocess skipped`")


def skip_tick(tick: Tick, identities: dict[str, RunIdentity], reason: str) -> TickReport:
    """A stale tick runs no stage: each occurrence nobody started is recorded skipped, with
    the skip's event as reconcile emits it; one already completed is a duplicate; one started
    is left to its holder or to reconcile."""
    finished = tick.ledger.finished([i.run_id for i in identities.values()])
    recorded = set(tick.ledger.occurrences.skip([(i, reason) for s, i in identities.items()
                                                 if i.run_id not in finished]))
    emit_decisions(tick.ledger, tick.job, {})
    outcomes = []
    for subject, identity in identities.items():
        run = finished.get(identity.run_id)
        if run is not None and run.status == "completed":
            outcome = duplicate_outcome(subject, run)
        elif run is not None:
            outcome = failed_permanently(subject, run)
        else:
            left = "" if identity.run_id in recorded else " (started before: left to reconcile)"
            outcome = SubjectOutcome(subject, identity.run_id, "skipped",
                                     run.attempts if run else 0, error=reason + left)
            if identity.run_id in recorded:  # its event is the skip decision's, emitted above
                outcomes.append(outcome)
                continue
        outcomes.append(tick.emit(outcome))
    return TickReport(tick.job.name, tick.job.version, tick.period, outcomes)

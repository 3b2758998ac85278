"""The ``review-outbox`` Prefect flow: it lists the held messages of a job's period (or of one
Run, or of every job), shows them as an artifact and in the description of a form, and pauses
until a person fills that form in the Prefect UI (or through its API, ``resume_flow_run`` with
the input); then it records the decisions in the ledger, where the ordinary deliver-outbox
pass sends the approved messages once, with their keys.

``pause_flow_run``, not ``suspend_flow_run``: a suspended flow run starts again from the top
when resumed, so it would read the held messages again and could apply the reviewer's "approve
all" to a message that arrived after the form was shown. Paused, the run decides exactly the
messages its form listed. The cost is a worker process waiting; the review deployment runs on
its own work queue so that a wait holds no job's worker."""

from __future__ import annotations

from prefect import State, flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.states import Completed, Failed

from flows.review.form import UI_REASON, decided, description, review_form
from flows.review.select import Selection, held_messages
from flows.settings import RunledgerSettings
from store import Ledger

ARTIFACT_KEY = "review-outbox"


@flow(name="review-outbox", log_prints=True)
def review_outbox(job: str | None = None, period: str | None = None, run: str | None = None,
                  timeout_hours: float | None = None, poll_seconds: int = 10) -> State[str]:
    """Wait for a person to approve or reject held outbox messages in the Prefect UI.

    Args:
        job: Only this job's held messages (with ``period``: only that period's).
        period: A period of ``job``, such as 2026-12-05 (in the job's timezone).
        run: Only this Run's held messages (its id or a unique prefix).
        timeout_hours: How long the form waits (default: RUNLEDGER_APPROVAL_DEADLINE_HOURS);
            then the run ends Failed (Prefect fails a pause nobody resumed) and the messages
            stay held, reported by `runledger overdue` once their deadline passes.
        poll_seconds: How often the paused run looks for the answer.
    """
    logger = get_run_logger()
    chosen = Selection(run=run, job=job, period=period)
    with Ledger.open_existing() as ledger:
        held = held_messages(ledger, job, period, run)
    if not held:
        return Completed(message=f"no message of {chosen.describe()} waits for approval")
    create_markdown_artifact(description(held, chosen), key=ARTIFACT_KEY,
                             description="Held outbox messages waiting for a decision")
    hours = timeout_hours or RunledgerSettings().approval_deadline_hours
    logger.info("%d held message(s) of %s: waiting up to %g h for a decision", len(held),
                chosen.describe(), hours)
    try:
        form = pause_flow_run(wait_for_input=review_form(held, chosen),
                              timeout=max(1, round(hours * 3600)), poll_interval=poll_seconds)
    except FlowPauseTimeout:
        unanswered = (f"nobody decided on {len(held)} held message(s) of {chosen.describe()} "
                      f"within {hours:g} h: they stay held (`runledger outbox held`)")
        logger.error(unanswered)
        return Failed(name="Unanswered", message=unanswered)
    chosen_now = decided(form, held)
    with Ledger.open_existing() as ledger:
        if chosen_now.approve:
            ledger.outbox.decide(chosen_now.approve, "approved", chosen_now.by, chosen_now.reason)
        if chosen_now.reject:
            ledger.outbox.decide(chosen_now.reject, "rejected", chosen_now.by,
                                 chosen_now.reason or UI_REASON)
    return Completed(message=(
        f"approved {len(chosen_now.approve)}, rejected {len(chosen_now.reject)}, kept held "
        f"{len(chosen_now.kept)} (by {chosen_now.by})"))

"""Named fault-injection points for crash tests: a process whose $RUNLEDGER_FAULTS lists a point
kills itself with SIGKILL when it gets there. Every ledger transition has one right after its
commit, before its caller hears of it (``store.ledger``); the stage boundaries that are not
commits have one each (the model's answer, the receiver's acceptance of a message, a batch's
file uploaded and its provider batch created before their ids are stored, its results read). The list is
read once, when this module is imported: an unlisted point costs one dict lookup."""

from __future__ import annotations

import os
import signal

from store.errors import InvalidInput

ENV = "RUNLEDGER_FAULTS"

# After the commit of one ledger transition (store/ledger.py, or a book of it such as
# store/outbox_book.py: the method of that name).
AFTER_REGISTER_COMMIT = "after_register_commit"
AFTER_CLAIM_COMMIT = "after_claim_commit"
AFTER_REGISTER_AND_CLAIM_COMMIT = "after_register_and_claim_commit"  # a tick's register+claim
AFTER_RENEW_MANY_COMMIT = "after_renew_many_commit"  # the lease keeper's renewal
AFTER_SAVE_INPUT_COMMIT = "after_save_input_commit"  # collect: the raw input is stored
AFTER_COMPLETE_COMMIT = "after_complete_commit"  # persist: output, outbox rows and effect
AFTER_FAIL_COMMIT = "after_fail_commit"
AFTER_REQUEUE_RUN_COMMIT = "after_requeue_run_commit"
AFTER_TAKE_OVER_COMMIT = "after_take_over_commit"  # an operator took over a lease (fence raised)
AFTER_REQUEST_REVISION_COMMIT = "after_request_revision_commit"  # a revision is pending
AFTER_OWE_COMMIT = "after_owe_commit"
AFTER_SKIP_COMMIT = "after_skip_commit"
AFTER_UNSKIP_COMMIT = "after_unskip_commit"
AFTER_MARK_OVERDUE_COMMIT = "after_mark_overdue_commit"
AFTER_MARK_RECOVERED_COMMIT = "after_mark_recovered_commit"
AFTER_GIVE_UP_COMMIT = "after_give_up_commit"
AFTER_CLAIM_EVENTS_COMMIT = "after_claim_events_commit"  # reconcile leases unemitted events
AFTER_MARK_EMITTED_COMMIT = "after_mark_emitted_commit"  # ...and records them emitted
AFTER_CLAIM_MESSAGES_COMMIT = "after_claim_messages_commit"
AFTER_MARK_SENT_COMMIT = "after_mark_sent_commit"  # the dispatcher's sent mark
AFTER_SCHEDULE_RETRY_COMMIT = "after_schedule_retry_commit"
AFTER_MARK_UNCERTAIN_COMMIT = "after_mark_uncertain_commit"
AFTER_MARK_DEAD_COMMIT = "after_mark_dead_commit"
AFTER_RELEASE_MESSAGE_COMMIT = "after_release_message_commit"
AFTER_REQUEUE_MESSAGE_COMMIT = "after_requeue_message_commit"
AFTER_DECIDE_MESSAGES_COMMIT = "after_decide_messages_commit"  # held messages approved or rejected
AFTER_COUNT_SUPPRESSED_COMMIT = "after_count_suppressed_commit"  # the end of a tick
AFTER_PRUNE_BATCH_COMMIT = "after_prune_batch_commit"  # one batch of tombstones (prune)
AFTER_CALL_INTENT_COMMIT = "after_call_intent_commit"  # a model call recorded, not yet sent
AFTER_TAKE_SLOT_COMMIT = "after_take_slot_commit"  # an endpoint's slot taken, the call not recorded
AFTER_CHECKPOINT_COMMIT = "after_checkpoint_commit"  # an answer recorded and checkpointed
AFTER_CALL_FAILURE_COMMIT = "after_call_failure_commit"  # a call recorded refused or failed
AFTER_MARK_LOST_COMMIT = "after_mark_lost_commit"  # a Run's calls in flight marked lost
AFTER_REPLAY_COMMIT = "after_replay_commit"  # a checkpoint handed out, counted as reused
AFTER_REJECT_ANSWERS_COMMIT = "after_reject_answers_commit"
AFTER_REFUSE_BUDGET_COMMIT = "after_refuse_budget_commit"  # a call refused by the budget
AFTER_COUNT_SAVED_COMMIT = "after_count_saved_commit"  # what a tick's duplicates would cost
AFTER_RELEASE_OVER_BUDGET_COMMIT = "after_release_over_budget_commit"  # a refused Run released
AFTER_WAIT_FOR_BATCH_COMMIT = "after_wait_for_batch_commit"  # a Run waits for its batch
AFTER_BATCH_INTENT_COMMIT = "after_batch_intent_commit"  # a batch opened, its calls stamped
AFTER_BATCH_FILE_COMMIT = "after_batch_file_commit"  # a batch file id stored (or cleared)
AFTER_BATCH_SUBMITTED_COMMIT = "after_batch_submitted_commit"  # the provider's batch id stored
AFTER_CLAIM_BATCH_COMMIT = "after_claim_batch_commit"  # a batch's lease taken
AFTER_BATCH_POLLED_COMMIT = "after_batch_polled_commit"  # a running batch's status noted
AFTER_SETTLE_RESULTS_COMMIT = "after_settle_results_commit"  # result lines settled
AFTER_FINISH_BATCH_COMMIT = "after_finish_batch_commit"  # a batch settled, its Runs released

# Stage boundaries that are not commits.
AFTER_MODEL_ANSWER = "after_model_answer"  # the provider answered, nothing of it stored yet
AFTER_SEND_BEFORE_MARK = "after_send_before_mark"  # flows/delivery/dispatcher.py: data accepted
AFTER_BATCH_UPLOAD = "after_batch_upload"  # a batch's file uploaded, its id not stored
AFTER_BATCH_CREATE = "after_batch_create"  # the provider's batch created, its id not stored
MID_RESULTS_DOWNLOAD = "mid_results_download"  # a batch's results partly read, none settled

LEDGER_POINTS = (
    AFTER_REGISTER_COMMIT, AFTER_CLAIM_COMMIT, AFTER_REGISTER_AND_CLAIM_COMMIT,
    AFTER_RENEW_MANY_COMMIT, AFTER_SAVE_INPUT_COMMIT, AFTER_COMPLETE_COMMIT,
    AFTER_FAIL_COMMIT, AFTER_REQUEUE_RUN_COMMIT, AFTER_TAKE_OVER_COMMIT,
    AFTER_REQUEST_REVISION_COMMIT,
    AFTER_OWE_COMMIT, AFTER_SKIP_COMMIT,
    AFTER_UNSKIP_COMMIT, AFTER_MARK_OVERDUE_COMMIT, AFTER_MARK_RECOVERED_COMMIT,
    AFTER_GIVE_UP_COMMIT, AFTER_CLAIM_EVENTS_COMMIT, AFTER_MARK_EMITTED_COMMIT,
    AFTER_CLAIM_MESSAGES_COMMIT, AFTER_MARK_SENT_COMMIT,
    AFTER_SCHEDULE_RETRY_COMMIT, AFTER_MARK_UNCERTAIN_COMMIT, AFTER_MARK_DEAD_COMMIT,
    AFTER_RELEASE_MESSAGE_COMMIT, AFTER_REQUEUE_MESSAGE_COMMIT, AFTER_DECIDE_MESSAGES_COMMIT,
    AFTER_COUNT_SUPPRESSED_COMMIT,
    AFTER_PRUNE_BATCH_COMMIT, AFTER_TAKE_SLOT_COMMIT, AFTER_CALL_INTENT_COMMIT,
    AFTER_CHECKPOINT_COMMIT,
    AFTER_CALL_FAILURE_COMMIT, AFTER_MARK_LOST_COMMIT, AFTER_REPLAY_COMMIT,
    AFTER_REJECT_ANSWERS_COMMIT, AFTER_REFUSE_BUDGET_COMMIT, AFTER_COUNT_SAVED_COMMIT,
    AFTER_RELEASE_OVER_BUDGET_COMMIT, AFTER_WAIT_FOR_BATCH_COMMIT, AFTER_BATCH_INTENT_COMMIT,
    AFTER_BATCH_FILE_COMMIT, AFTER_BATCH_SUBMITTED_COMMIT, AFTER_CLAIM_BATCH_COMMIT,
    AFTER_BATCH_POLLED_COMMIT, AFTER_SETTLE_RESULTS_COMMIT, AFTER_FINISH_BATCH_COMMIT,
)
POINTS = (*LEDGER_POINTS, AFTER_MODEL_ANSWER, AFTER_SEND_BEFORE_MARK, AFTER_BATCH_UPLOAD,
          AFTER_BATCH_CREATE, MID_RESULTS_DOWNLOAD)


def armed_points(listed: str) -> dict[str, int]:
    """The points a $RUNLEDGER_FAULTS value lists (comma-separated ``name`` or ``name@N``: die
    the Nth time there, default the first), each with its N; an unknown name is refused, so
    that a misspelt point cannot leave a crash test passing without a crash."""
    armed: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in listed.split(","))):
        name, _, nth = entry.partition("@")
        if name not in POINTS:
            raise InvalidInput(f"{ENV} lists the unknown fault point {name!r}; the points are "
                               f"{', '.join(POINTS)}")
        if nth and not (nth.isdigit() and int(nth) >= 1):
            raise InvalidInput(f"{ENV}: {entry!r} must count from 1, as in {name}@2")
        armed[name] = int(nth or 1)
    return armed


_ARMED = armed_points(os.environ.get(ENV, ""))


def fault_point(name: str) -> None:
    """SIGKILL this process here if ``name`` is listed in $RUNLEDGER_FAULTS (the Nth time)."""
    if name in _ARMED:
        _ARMED[name] -= 1  # not exact across threads, nor meant to be: a random kill point
        if _ARMED[name] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)

"""One subject's whole life through the real ledger, model wrapper and dispatcher, passing every
named fault point: the job owes it, a neighbouring period is skipped and unskipped, its
occurrence is reported overdue, its Run is registered and claimed, renewed, given its input and
the model's answer (its call recorded before it left, its answer checkpointed), completed with
four outbox rows and a business effect, a revision of it requested (left pending), reported
recovered, and counted as a duplicate with its cost; a side Run spends (a call answered, one
refused, its answers rejected, one refused by the budget, released over budget, claimed again:
its calls in flight marked lost, its checkpoint looked up, its last call made through a
limited endpoint's slot, completed); another side Run is
claimed, failed, requeued and given up; another's call is queued for a provider's batch
(it waits, the batch is opened, submitted, polled, settled and finished, and it completes
with the batch's answer); a Run of another job is completed and
pruned to its tombstone; the decisions' events are claimed and recorded emitted; the mail is delivered to a sink that
answers 451 once, drops the connection once and refuses one recipient (550), and the refused
message is requeued once.

``walk`` can run again after a crash anywhere: each step starts from what the ledger holds (a
dead walker's lease is waited out). As a process, ``python -m tests.support.fault_walk URL
SUBJECT HOST PORT`` walks once; with $RUNLEDGER_FAULTS set it dies at that point."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.mail.settings import SmtpSettings, TlsMode
from flows.mail.sink import Fault
from flows.mail.smtp import SmtpTransport
from flows.model import (
    CallCount,
    EndpointLimiter,
    Generation,
    ModelRejected,
    OfflineModel,
    RecordedModel,
    Request,
)
from flows.prices import NO_PRICES
from store import (
    AFTER_BATCH_CREATE,
    AFTER_BATCH_UPLOAD,
    MID_RESULTS_DOWNLOAD,
    AlreadyQueued,
    BatchClaim,
    BatchCounts,
    BudgetExhausted,
    Charge,
    Claim,
    End,
    Intent,
    LeaseLost,
    Ledger,
    Limits,
    OutboxMessage,
    Queued,
    QueuedMessage,
    Run,
    RunIdentity,
    Usage,
    Window,
    fault_point,
    unemitted,
)
from tests.support.ledger import register_and_claim, wait_for_db_clock

JOB = "fault-walk"
PRUNED_JOB = "fault-walk-retention"  # its own job: pruning it never touches the walked Run
PERIOD = datetime(2026, 3, 2, tzinfo=UTC)
PARAMS = {"units": 10}
RUN_LEASE = 1.0  # a dead walker's Run lease is waited out by the rerun
# The sink's answers are immediate; the timeout only has to outlast a loaded machine (at 0.2 s
# a reply slower than that under load used a retry attempt up, and a message went dead).
SMTP_TIMEOUT = 1.0
# A dead dispatcher's leases are waited out by the rerun; the lease is at least twice the
# longest send (3 x SMTP_TIMEOUT), as the dispatcher requires.
DELIVERY_LEASE = 6.5
POLICY = RetryPolicy(max_attempts=5, base_delay=0.01, max_delay=0.02, max_window=3600)
KINDS = ("ok", "retry", "uncertain", "dead")
WALK_SECONDS = 180.0  # a bound on delivering one walk's messages, not a target

EFFECTS = sa.MetaData()
# Append-only, so that a second application of the effect would show as a second row.
EFFECT = sa.Table(
    "walk_effects", EFFECTS,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("subject", sa.String(200), nullable=False),
)


def identity(subject: str, days: int = 0) -> RunIdentity:
    """The walked Run (``days`` 0), the skipped neighbour (1) and the side Run (2)."""
    return RunIdentity(JOB, subject, PERIOD + timedelta(days=days), "1")


def recipient(subject: str, kind: str) -> str:
    return f"{kind}-{subject}@example.com"


def sink_faults(subjects: list[str]) -> list[Fault]:
    """What the sink answers each subject's retry, uncertain and dead recipients."""
    faults: list[Fault] = []
    for s in subjects:
        faults += [Fault("rcpt", "451", 1, recipient(s, "retry")),
                   Fault("data", "drop", 1, recipient(s, "uncertain")),
                   Fault("rcpt", "550", None, recipient(s, "dead"))]
    return faults


def walk(ledger: Ledger, subject: str, host: str, port: int) -> None:
    """The whole life of ``subject``, from wherever an earlier walk left it."""
    owner = f"walker:{os.getpid()}"
    main = identity(subject)
    ledger.occurrences.owe(JOB, {subject: PERIOD})
    skipped = identity(subject, 1)
    ledger.occurrences.skip([(skipped, "walked past")])
    ledger.occurrences.unskip([skipped.run_id])
    ledger.occurrences.mark_overdue([main])
    _tick(ledger, main, owner)
    ledger.request_revision(main.run_id, "walk: revised", requested_by=f"walk:{subject}")
    ledger.count_suppressed(JOB, PERIOD.date(), duplicates=1, in_progress_elsewhere=0)
    ledger.calls.count_saved(JOB, PERIOD.date(), [main.run_id])
    _spend(ledger, identity(subject, 3), owner)
    ledger.occurrences.mark_recovered(JOB)
    _operate(ledger, identity(subject, 2), owner)
    _take_over(ledger, identity(subject, 4), owner)
    _review(ledger, identity(subject, 5), owner)
    _batch(ledger, identity(subject, 6), owner)
    _prune(ledger, RunIdentity(PRUNED_JOB, subject, PERIOD, "1"), owner)
    _emit(ledger)
    _deliver(ledger, main.run_id, host, port)


def _tick(ledger: Ledger, main: RunIdentity, owner: str) -> None:
    """Register+claim, renew, collect, transform, complete, as a tick's stages do."""
    while True:
        found = register_and_claim(ledger, main, PARAMS, owner=owner, lease=RUN_LEASE)
        if found.run.status == "completed":
            return
        if found.claim is not None:
            break
        assert found.run.lease_expires_at is not None, found.run
        wait_for_db_clock(ledger, found.run.lease_expires_at)
    claim = found.claim
    ledger.renew_many([claim], RUN_LEASE)
    raw = ledger.save_input(claim, {"text": f"News about {main.subject}. Prices went up."})
    model = RecordedModel(OfflineModel(), ledger.calls, claim, NO_PRICES, CallCount())
    answer = model.generate(raw["text"], system="Summarize.")
    messages = [OutboxMessage(recipient(main.subject, k), f"walk {k}", answer.text)
                for k in KINDS]

    def effect(session: Session, output: dict[str, Any]) -> None:
        session.execute(EFFECT.insert().values(subject=main.subject))

    ledger.complete(claim, {"text": answer.text}, messages, effect)


def given_up(run: Run) -> bool:
    return run.status == "failed" and (run.error or "").startswith("gave up")


def _operate(ledger: Ledger, side: RunIdentity, owner: str) -> None:
    """A side Run: claimed, failed for good, requeued by an operator, given up by reconcile."""
    run = ledger.register(side)
    if run.status in ("pending", "running") and not (run.status == "pending" and run.attempts):
        run = ledger.fail(_claim_when_free(ledger, run, owner), "walk: refused", retryable=False)
    if run.status == "failed" and not given_up(run):
        run = ledger.requeue_run(run.run_id)
    if run.status == "pending":
        (state,) = [s for s in ledger.occurrences.run_states(JOB, side.period_start) if s.run_id == run.run_id]
        ledger.occurrences.give_up(state, max_attempts=1)


def _take_over(ledger: Ledger, side: RunIdentity, owner: str) -> None:
    """A side Run claimed by a worker an operator says is dead: its lease is taken over, and
    it waits pending for the next claim."""
    run = ledger.register(side)
    if run.attempts == 0:
        assert ledger.claim(side.run_id, owner, RUN_LEASE) is not None
    if ledger.get(side.run_id).status == "running":
        ledger.take_over(side.run_id)


def _review(ledger: Ledger, side: RunIdentity, owner: str) -> None:
    """A side Run whose one message is held for a person's review, then rejected (so that
    the walk's delivery passes send exactly what they sent before holds existed)."""
    found = register_and_claim(ledger, side, PARAMS, owner=owner, lease=RUN_LEASE)
    if found.run.status != "completed":
        claim = found.claim or _claim_when_free(ledger, found.run, owner)
        ledger.complete(claim, {"text": "held for review"}, [OutboxMessage(
            f"{side.subject}@review.example.org", "walk review", "read me first",
            hold=timedelta(hours=1))])
    held = [m.message_id for m in ledger.outbox.messages(run_id=side.run_id)
            if m.status == "held"]
    if held:
        ledger.outbox.decide(held, "rejected", f"walk:{side.subject}", "walk: not to be sent")


BATCH_LEASE = 3.0  # a batch's lease; a dead walker's is waited out by the rerun
BATCH_DIGEST = "b" * 64
BATCH_ENDPOINT = "walk-batch"


def batch_key(side: RunIdentity) -> str:
    return f"walk-{side.subject}"[:64]


def _batch(ledger: Ledger, side: RunIdentity, owner: str) -> None:
    """A side Run whose one call is queued for a provider's batch: the Run waits; the batch is
    opened, its file uploaded and the provider's batch created (no provider here: the ids are
    made up), polled once while running, its result line settled and the batch finished; the
    released Run is claimed again, replays the batch's answer and completes."""
    while (run := ledger.register(side)).status != "completed":
        if run.status == "waiting":
            _drive_batch(ledger, batch_key(side), owner)
            continue
        claim = _claim_when_free(ledger, run, owner)
        found = ledger.calls.replay(claim, 0, BATCH_DIGEST)
        if found is not None:
            ledger.complete(claim, {"text": found.answer["text"]})
            return
        with suppress(AlreadyQueued):
            ledger.calls.record_intent(claim, Intent(
                BATCH_ENDPOINT, "m", 0, BATCH_DIGEST,
                queued=Queued(f"{side.subject}-0"[:64], {"messages": ["batched"]})))
        ledger.batches.wait_for_batch(claim, "walk: waiting for its batch")


def _drive_batch(ledger: Ledger, key: str, owner: str) -> None:
    """The submitter's and the poller's steps on the batch ``key``, from wherever an earlier
    walk left it, until it is settled (a lease lost on the way: the next round starts over)."""
    while True:
        batch = ledger.batches.get(key)
        if batch is None:
            opened = ledger.batches.open_batch(key, job=JOB, endpoint=BATCH_ENDPOINT, model="m",
                                               kind="openai", owner=owner, lease=BATCH_LEASE,
                                               max_requests=10)
            assert opened is not None, key
            claim: BatchClaim | None = opened.claim
        elif batch.status == "settled":
            return
        elif (claim := ledger.batches.claim_batch(key, owner, BATCH_LEASE)) is None:
            assert batch.lease_expires_at is not None, batch
            wait_for_db_clock(ledger, batch.lease_expires_at)
            continue
        assert claim is not None
        _batch_step(ledger, claim)


def _batch_step(ledger: Ledger, claim: BatchClaim) -> None:
    """One holder's step: upload and create an open batch, poll a submitted one once (an
    operator cancels it then), then settle its results and finish it."""
    book = ledger.batches
    if claim.status == "open":
        if claim.provider_file_id is None:
            book.lines(claim.key)  # what the file would hold
            fault_point(AFTER_BATCH_UPLOAD)
            if book.record_file(claim, f"file-{claim.key}", BATCH_LEASE) != "recorded":
                return
        fault_point(AFTER_BATCH_CREATE)
        book.record_submitted(claim, f"batch-{claim.key}", "validating")
        return
    batch = book.get(claim.key)
    assert batch is not None
    if batch.polled_at is None:
        # An operator's `runledger batches cancel` while it runs: its deadline is now.
        book.stop_waiting(claim.key)
        book.record_polled(claim, "in_progress", BatchCounts(total=1, completed=0, failed=0))
        return
    fault_point(MID_RESULTS_DOWNLOAD)
    ends = [(call.custom_id, End("answered", Usage(10, 5), answer={"text": "batched"}))
            for call in book.calls_of(claim.key) if call.custom_id is not None]
    book.settle_results(claim, ends)
    with suppress(LeaseLost):
        book.finish_batch(claim, "completed")


def _prune(ledger: Ledger, old: RunIdentity, owner: str) -> None:
    """A Run of another job, completed and then pruned to its tombstone (a cutoff a day
    ahead of the database clock makes it old enough)."""
    found = register_and_claim(ledger, old, PARAMS, owner=owner, lease=RUN_LEASE)
    if found.run.status != "completed":
        claim = found.claim or _claim_when_free(ledger, found.run, owner)
        ledger.complete(claim, {"text": "to be pruned"})
    cutoff, cursor = ledger.now() + timedelta(days=1), ""
    while (following := ledger.retention.prune_batch(cutoff, [PRUNED_JOB], limit=10,
                                                     after=cursor).cursor) is not None:
        cursor = following


def _emit(ledger: Ledger) -> None:
    """What reconcile does after its decisions: lease those whose events are not known emitted
    (a dead walker's lease is waited out), then record them emitted (no Prefect here)."""
    while not (claimed := ledger.occurrences.claim_events(JOB, RUN_LEASE)):
        if not any(unemitted(o) for o in ledger.occurrences.list(JOB, PERIOD)):
            return
        time.sleep(0.1)
    ledger.occurrences.mark_emitted(claimed)


SIDE_TEXT = "Side news. Prices went down."


class Refusing:
    """A model whose provider refuses every request (HTTP 400)."""

    name = "refusing"
    endpoint = "loopback"
    max_tokens = 16

    def complete(self, request: Request) -> Generation:
        refused = ModelRejected("model refusing refused the request with HTTP 400")
        refused.status = 400
        raise refused

    def close(self) -> None:
        return None


def _spend(ledger: Ledger, side: RunIdentity, owner: str) -> None:
    """A side Run's model calls: one answered and checkpointed, one refused, its answers
    rejected by validation, one refused by an exhausted budget and the Run released over
    budget; claimed again, its calls in flight are marked lost, its checkpoint looked up (none:
    rejected), one call answered through a limited endpoint's slot, and it completes."""
    run = ledger.register(side)
    if run.status == "completed":
        return
    claim = _claim_when_free(ledger, run, owner)
    RecordedModel(OfflineModel(), ledger.calls, claim, NO_PRICES, CallCount()).generate(SIDE_TEXT)
    with suppress(ModelRejected):
        RecordedModel(Refusing(), ledger.calls, claim, NO_PRICES, CallCount()).generate("no")
    ledger.calls.reject_answers(claim)
    empty = Charge(JOB, "tokens", None, 1, (Window("period", side.period_start, 0),))
    with suppress(BudgetExhausted):
        ledger.calls.record_intent(claim, Intent("offline", "m", 2, "0" * 64, empty))
    ledger.calls.release_over_budget(claim, "walk: over budget")
    again = _claim_when_free(ledger, ledger.get(side.run_id), owner)
    ledger.calls.configure_endpoint("walk-endpoint", Limits(requests_per_minute=60_000))
    limiter = EndpointLimiter(ledger.calls, "walk-endpoint", in_flight_seconds=60,
                              max_pause_seconds=1, bounds_in_flight=False)
    RecordedModel(OfflineModel(), ledger.calls, again, NO_PRICES, CallCount(),
                  limiter=limiter).generate(SIDE_TEXT)
    ledger.complete(again, {"text": "side"})


def _claim_when_free(ledger: Ledger, run: Run, owner: str) -> Claim:
    while (claim := ledger.claim(run.run_id, owner, RUN_LEASE)) is None:
        run = ledger.get(run.run_id)
        assert run.lease_expires_at is not None, run
        wait_for_db_clock(ledger, run.lease_expires_at)
    return claim


def unsettled(messages: list[QueuedMessage]) -> list[QueuedMessage]:
    """Messages a dispatcher still has to try (or that a dead one still holds)."""
    return [m for m in messages if m.status in ("pending", "retry", "sending")
            or (m.status == "uncertain" and m.next_attempt_at is not None)]


def delivery_pass(ledger: Ledger, host: str, port: int, *, timeout: float, lease: float,
                  policy: RetryPolicy, mark_batch: int = 20, batch_size: int = 100) -> None:
    """One dispatcher pass to the SMTP sink at ``host``:``port`` (plain SMTP on loopback)."""
    settings = SmtpSettings(host=host, port=port, tls=TlsMode.NONE, mail_from="jobs@example.com",
                            timeout=timeout)
    dispatcher = Dispatcher(ledger, SmtpTransport(settings), policy, lease_seconds=lease,
                            mark_batch=mark_batch)
    asyncio.run(dispatcher.run_pass(batch_size=batch_size, max_seconds=10))


def _deliver(ledger: Ledger, run_id: str, host: str, port: int) -> None:
    """Delivery passes until every message is settled; the refused one is requeued once."""
    deadline = time.monotonic() + WALK_SECONDS
    while True:
        while unsettled(ledger.outbox.messages(run_id=run_id)):
            assert time.monotonic() < deadline, ledger.outbox.messages(run_id=run_id)
            delivery_pass(ledger, host, port, timeout=SMTP_TIMEOUT, lease=DELIVERY_LEASE,
                          policy=POLICY)
            time.sleep(0.05)
        (dead,) = [m for m in ledger.outbox.messages(run_id=run_id) if m.status == "dead"]
        refusals = [a for a in ledger.outbox.delivery_attempts(dead.message_id) if a.outcome == "dead"]
        if len(refusals) >= 2:
            return
        ledger.outbox.requeue_message(dead.message_id)


def main(url: str, subject: str, host: str, port: str) -> None:
    with Ledger.connect(url) as ledger:
        walk(ledger, subject, host, int(port))


if __name__ == "__main__":
    main(*sys.argv[1:])

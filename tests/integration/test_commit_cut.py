"""The connection drops around COMMIT, so the caller cannot know whether
its transaction committed. A loopback proxy (``commit_cut``) between the ledger and PostgreSQL
cuts the connection at the commit of save_input, of a completion with outbox rows and the
daily-credit job's business effect (an explicit COMMIT; without an effect, the completion's
implicit commit in autocommit) and of the dispatcher's sent mark: before the server applied it
and after. The caller gets ``LedgerUnavailable`` either way; its retry with the same claim finds
its own completion (no second outbox row, no second credit) or does it, once. The dispatcher
retries its sent mark itself, which finds its own mark or makes it: one copy at the receiver.

PostgreSQL only, by nature: SQLite has no connection to cut."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

from flows.delivery.dispatcher import Dispatcher
from flows.jobs import daily_credit
from flows.mail.sink import Sink
from flows.mail.smtp import SmtpTransport
from store import Claim, Ledger, OutboxMessage
from store.errors import LedgerUnavailable
from tests.conftest import PostgresDatabases
from tests.support.commit_cut import CommitCutProxy
from tests.support.delivery import FAST, queue, smtp_settings
from tests.support.ledger import register_and_claim

ACCOUNT = "account-7"
PERIOD = daily_credit.job.parse_period("2026-03-02")
WHEN = ["before", "after"]
NOTICES = [OutboxMessage(r, "Credited", "10 units") for r in ("ana@example.com", "ben@example.com")]

pytestmark = [pytest.mark.processes, pytest.mark.drill]


@pytest.fixture
def url(postgres_databases: PostgresDatabases) -> Iterator[str]:
    """A fresh migrated PostgreSQL ledger with the daily-credit job's credits table."""
    made = postgres_databases.create()
    with Ledger.connect(made) as ledger:
        ledger.create_tables(daily_credit.CreditTables.metadata)
    yield made
    postgres_databases.drop(made)


@pytest.fixture
def proxy(url: str) -> Iterator[CommitCutProxy]:
    parsed = sa.engine.make_url(url)
    with CommitCutProxy((parsed.host or "127.0.0.1", parsed.port or 5432)) as started:
        yield started


@pytest.fixture
def direct(url: str) -> Iterator[Ledger]:
    """The ledger without the proxy, to see what the server holds."""
    with Ledger.connect(url) as ledger:
        yield ledger


@pytest.fixture
def cut(url: str, proxy: CommitCutProxy) -> Iterator[Ledger]:
    """The ledger through the proxy."""
    through = sa.engine.make_url(url).set(host="127.0.0.1", port=proxy.port).update_query_dict(
        {"sslmode": "disable", "gssencmode": "disable"})
    with Ledger.connect(through.render_as_string(hide_password=False)) as ledger:
        yield ledger


def claimed(ledger: Ledger) -> Claim:
    identity = daily_credit.job.identity(ACCOUNT, PERIOD)
    found = register_and_claim(ledger, identity, daily_credit.job.run_params(ACCOUNT, PERIOD),
                               owner="worker-1", lease=60)
    assert found.claim is not None
    return found.claim


def credits(ledger: Ledger) -> list[int]:
    with Session(ledger.engine) as session:
        return list(session.exec(select(daily_credit.Credit.units)).all())


def figures(ledger: Ledger, run_id: str) -> dict[str, Any]:
    run = ledger.get(run_id)
    return {"status": run.status, "runs": len(ledger.runs(job=daily_credit.job.name)),
            "outbox rows": len(ledger.outbox.messages(run_id=run_id)), "credits": credits(ledger)}


@pytest.mark.parametrize("when", WHEN)
def test_a_save_input_whose_commit_was_cut_is_retried_and_the_input_stored_once(
        when: str, proxy: CommitCutProxy, cut: Ledger, direct: Ledger) -> None:
    """The retry of a save_input cut before or after its commit returns the stored input."""
    claim = claimed(cut)
    raw = daily_credit.collect(ACCOUNT, PERIOD)
    armed = proxy.arm(when, "save_input")
    with pytest.raises(LedgerUnavailable):
        cut.save_input(claim, raw)
    assert armed.done.is_set()
    assert (direct.get(claim.run_id).raw_input is not None) == (when == "after")
    assert cut.save_input(claim, raw) == raw
    run = direct.get(claim.run_id)
    assert (run.raw_input, run.fence, run.owner) == (raw, claim.fence, claim.owner)
    print(f"\nsave_input cut {when} commit: committed={when == 'after'}, retry stored the "
          f"input once; {figures(direct, claim.run_id)}")


@pytest.mark.parametrize("effect", [True, False], ids=["with-effect", "autocommit"])
@pytest.mark.parametrize("when", WHEN)
def test_a_completion_whose_commit_was_cut_is_retried_into_one_completion(
        when: str, effect: bool, proxy: CommitCutProxy, cut: Ledger, direct: Ledger) -> None:
    """The retry of a completion cut before or after its commit finds its own completion or
    completes now: one output, two outbox rows and (with the effect) one credit, either way."""
    claim = claimed(cut)
    raw = cut.save_input(claim, daily_credit.collect(ACCOUNT, PERIOD))
    output = daily_credit.transform(raw, None).output()  # type: ignore[arg-type]

    def credit(session: Session, output: dict[str, Any]) -> None:
        daily_credit.effect(session, output)

    armed = proxy.arm(when, "complete_run")
    with pytest.raises(LedgerUnavailable):
        cut.complete(claim, output, NOTICES, credit if effect else None)
    assert armed.done.is_set()
    committed = when == "after"
    seen = figures(direct, claim.run_id)
    assert seen == {"status": "completed" if committed else "running", "runs": 1,
                    "outbox rows": 2 if committed else 0,
                    "credits": [10] if committed and effect else []}
    retry = cut.complete(claim, output, NOTICES, credit if effect else None)
    assert retry.new is not committed
    assert retry.run.completed_attempt_id == claim.attempt_id  # its own completion
    after = figures(direct, claim.run_id)
    assert after == {"status": "completed", "runs": 1, "outbox rows": 2,
                     "credits": [10] if effect else []}
    assert [a.outcome for a in direct.attempts(claim.run_id)] == ["completed"]
    with Session(direct.engine) as session:
        assert daily_credit.balance(session, ACCOUNT) == (10 if effect else 0)
    print(f"\ncomplete ({'explicit COMMIT' if effect else 'autocommit'}) cut {when} commit: "
          f"after the cut {seen}; the retry {'found its own' if committed else 'made the'} "
          f"completion: {after}")


@pytest.mark.parametrize("when", WHEN)
def test_a_sent_mark_whose_commit_was_cut_is_retried_and_the_message_sent_once(
        when: str, proxy: CommitCutProxy, cut: Ledger, direct: Ledger) -> None:
    """The dispatcher retries the cut mark in the same pass: after the commit the retry finds
    its own mark, before it the retry makes it; either way the pass reports the message sent,
    the sink holds one copy and the outbox one sent attempt."""
    [message] = queue(direct, 1)
    with Sink() as sink:
        dispatcher = Dispatcher(cut, SmtpTransport(smtp_settings(sink)), FAST, lease_seconds=30)
        armed = proxy.arm(when, "mark_sent")
        report = asyncio.run(dispatcher.run_pass(max_seconds=10))
        assert armed.done.is_set()
        assert (report.counts["sent"], report.lost) == (1, 0)
        final = direct.outbox.message(message.message_id)
        assert final is not None and final.status == "sent"
        copies = [m.message_id for m in sink.messages]
        assert len(copies) == 1
        attempts = [(a.attempt, a.outcome) for a in direct.outbox.delivery_attempts(message.message_id)]
        assert attempts == [(1, "sent")]
    print(f"\nmark_sent cut {when} commit: the dispatcher's retry "
          f"{'found its own mark' if when == 'after' else 'marked it'}; status sent, sink "
          f"copies {len(copies)} of 1 Message-ID, attempts {attempts}")

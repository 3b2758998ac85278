"""Delivery over real loopback SMTP (aiosmtpd sink) on PostgreSQL and SQLite: idempotent passes,
stable Message-IDs, and each injected fault landing in the right state."""

from __future__ import annotations

import email
import json
import time

import pytest
from typer.testing import CliRunner, Result

from flows.cli import app
from flows.delivery.policy import RetryPolicy, UncertainPolicy
from flows.mail.errors import MailConfigurationError
from flows.mail.letter import KEY_HEADER, message_id_for
from flows.mail.settings import TlsMode
from flows.mail.sink import Fault, Sink
from flows.ports import free_port
from store import Ledger
from tests.support.delivery import cli_env, deliver, queue, statuses


def headers_of(sink: Sink) -> list[tuple[str | None, str]]:
    """(Message-ID, X-Idempotency-Key) of every message the sink accepted, in order."""
    out = []
    for received in sink.messages:
        parsed = email.message_from_bytes(received.data)
        out.append((parsed["Message-ID"], parsed[KEY_HEADER]))
    return out


def test_second_pass_sends_nothing(ledger: Ledger) -> None:
    """Deliver twice: the first pass sends every message once, the second finds nothing due."""
    queued = queue(ledger, 5)
    with Sink() as sink:
        first = deliver(ledger, sink)
        second = deliver(ledger, sink)
        assert first.counts["sent"] == 5
        assert sum(second.counts.values()) == 0
        assert sink.stats["received"] == 5
    assert statuses(ledger) == {"sent": 5}
    assert all(len(ledger.outbox.delivery_attempts(m.message_id)) == 1 for m in queued)


def test_every_message_carries_a_message_id_derived_from_its_key(ledger: Ledger) -> None:
    """The sink sees Message-ID <key@runledger> and X-Idempotency-Key: key for each outbox row."""
    queued = queue(ledger, 3)
    with Sink() as sink:
        deliver(ledger, sink)
        seen = sorted(headers_of(sink))
    assert seen == sorted((message_id_for(m.message_id), m.message_id) for m in queued)


def test_a_retried_message_keeps_its_message_id(ledger: Ledger) -> None:
    """A 451 then a success: both attempts carry the same key and the same Message-ID."""
    [message] = queue(ledger, 1)
    with Sink(dedupe=False, faults=[Fault("data", "451")]) as sink:
        first = deliver(ledger, sink)
        time.sleep(0.05)
        second = deliver(ledger, sink)
        assert (first.counts["retry"], second.counts["sent"]) == (1, 1)
        assert headers_of(sink) == [(message_id_for(message.message_id), message.message_id)]
    attempts = ledger.outbox.delivery_attempts(message.message_id)
    assert [(a.attempt, a.outcome, a.reply_code) for a in attempts] == [(1, "retry", 451),
                                                                       (2, "sent", 250)]


@pytest.mark.parametrize(
    ("spec", "status", "code", "sink_has_it"),
    [
        ("rcpt:421", "retry", 421, False),
        ("rcpt:451", "retry", 451, False),
        ("rcpt:550", "dead", 550, False),
        ("data:421", "retry", 421, False),
        ("data:451", "retry", 451, False),
        ("data:550", "dead", 550, False),
        ("data:drop", "uncertain", None, True),
        ("data:slow=6", "uncertain", None, True),
    ],
)
def test_each_fault_lands_in_its_state(
    ledger: Ledger, spec: str, status: str, code: int | None, sink_has_it: bool
) -> None:
    """One faulted message lands in retry/dead/uncertain with the reply recorded; the other
    message of the pass is still sent (over a new connection after a 421 or a lost one)."""
    queue(ledger, 2)
    with Sink(faults=[Fault.parse(spec)]) as sink:
        # The reply timeout outlasts a loaded machine's loopback, not the slow fault's 6 s.
        report = deliver(ledger, sink, timeout=3.0)
        assert sink.stats["received"] == (2 if sink_has_it else 1)
    assert statuses(ledger) == {"sent": 1, status: 1}
    [faulted] = ledger.outbox.messages(status=status)
    [attempt] = ledger.outbox.delivery_attempts(faulted.message_id)
    assert (attempt.outcome, attempt.reply_code) == (status, code)
    assert faulted.last_error
    assert report.counts[status] == 1


def test_a_permanent_rejection_is_never_retried(ledger: Ledger) -> None:
    """A 550 makes the message dead after one attempt; later passes never send it again."""
    [message] = queue(ledger, 1)
    with Sink(faults=[Fault("rcpt", "550", times=None)]) as sink:
        deliver(ledger, sink)
        time.sleep(0.05)
        again = deliver(ledger, sink)
        assert sum(again.counts.values()) == 0
        assert sink.stats["rejected"] == 1
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and stored.status == "dead" and stored.attempts == 1
    assert "550" in (stored.last_error or "")


def test_transient_failures_stop_at_the_attempt_limit(ledger: Ledger) -> None:
    """Always 451: retry, retry, then dead after max_attempts, with every attempt recorded."""
    [message] = queue(ledger, 1)
    with Sink(faults=[Fault("rcpt", "451", times=None)]) as sink:
        for _ in range(5):
            deliver(ledger, sink)
            time.sleep(0.05)
        assert sink.stats["received"] == 0
    outcomes = [a.outcome for a in ledger.outbox.delivery_attempts(message.message_id)]
    assert outcomes == ["retry", "retry", "dead"]
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and "gave up after 3 attempts" in (stored.last_error or "")


def test_transient_failures_stop_at_the_retry_window(ledger: Ledger) -> None:
    """A retry whose next try would fall outside the total window makes the message dead."""
    [message] = queue(ledger, 1)
    narrow = RetryPolicy(max_attempts=10, base_delay=0.01, max_delay=0.01, max_window=0.5)
    with Sink(faults=[Fault("rcpt", "451", times=None)]) as sink:
        deadline = time.monotonic() + 10
        while ledger.outbox.message(message.message_id).status != "dead":  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            deliver(ledger, sink, policy=narrow)
            time.sleep(0.1)
    stored = ledger.outbox.message(message.message_id)
    assert stored is not None and "retry window" in (stored.last_error or "")
    assert 1 < stored.attempts < 10


def test_an_uncertain_message_is_resent_with_the_same_message_id(ledger: Ledger) -> None:
    """Dropped after DATA: uncertain, then resent with the same Message-ID (the receiver can
    recognise the copy: one unique Message-ID, two copies received)."""
    [message] = queue(ledger, 1)
    with Sink(faults=[Fault("data", "drop")]) as sink:
        deliver(ledger, sink)
        assert ledger.outbox.message(message.message_id).status == "uncertain"  # type: ignore[union-attr]
        time.sleep(0.05)
        deliver(ledger, sink)
        assert sink.stats["received"] == 2 and sink.stats["unique"] == 1
        assert {h for h in headers_of(sink)} == {(message_id_for(message.message_id),
                                                  message.message_id)}
    assert ledger.outbox.message(message.message_id).status == "sent"  # type: ignore[union-attr]


def test_held_uncertain_messages_wait_for_an_operator_requeue(ledger: Ledger) -> None:
    """With the hold policy an uncertain message is not retried until requeued."""
    [message] = queue(ledger, 1)
    hold = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02,
                       uncertain=UncertainPolicy.HOLD)
    with Sink(faults=[Fault("data", "drop")]) as sink:
        deliver(ledger, sink, policy=hold)
        time.sleep(0.05)
        assert sum(deliver(ledger, sink, policy=hold).counts.values()) == 0
        held = ledger.outbox.messages(status="uncertain")
        assert [m.message_id for m in held] == [message.message_id]
        assert held[0].next_attempt_at is None
        ledger.outbox.requeue_message(message.message_id)
        assert deliver(ledger, sink, policy=hold).counts["sent"] == 1
        assert sink.stats["unique"] == 1


def test_authentication_failure_stops_the_run_and_burns_no_attempt(ledger: Ledger) -> None:
    """Wrong password: one MailConfigurationError naming the login (not the password); every
    claimed message goes back to pending with no attempt counted or recorded."""
    queued = queue(ledger, 3)
    with Sink(credentials=("mailer", "right-password")) as sink, \
            pytest.raises(MailConfigurationError) as failure:
        deliver(ledger, sink, username="mailer", password="wrong-password")
    assert "authentication as mailer" in str(failure.value)
    assert "wrong-password" not in str(failure.value)
    assert statuses(ledger) == {"pending": 3}
    for m in queued:
        stored = ledger.outbox.message(m.message_id)
        assert stored is not None and stored.attempts == 0
        assert ledger.outbox.delivery_attempts(m.message_id) == []


def test_correct_credentials_deliver(ledger: Ledger) -> None:
    """With the right password the AUTH exchange succeeds and the message is sent."""
    queue(ledger, 1)
    with Sink(credentials=("mailer", "right-password")) as sink:
        report = deliver(ledger, sink, username="mailer", password="right-password")
        assert report.counts["sent"] == 1 and sink.stats["received"] == 1


def test_starttls_required_but_not_offered_stops_the_run(ledger: Ledger) -> None:
    """RUNLEDGER_SMTP_TLS=starttls against a server without STARTTLS is a configuration error."""
    queue(ledger, 2)
    with Sink() as sink, pytest.raises(MailConfigurationError, match="does not offer STARTTLS"):
        deliver(ledger, sink, tls=TlsMode.STARTTLS)
    assert statuses(ledger) == {"pending": 2}


def test_an_unreachable_server_costs_one_attempt_and_ends_the_pass(ledger: Ledger) -> None:
    """Connection refused: the first message is scheduled for retry, the rest are given back
    untried, and the pass stops instead of failing every message."""
    queue(ledger, 4)
    closed = Sink(port=free_port())  # never started: nothing listens on its port
    report = deliver(ledger, closed)
    assert report.counts["retry"] == 1 and report.counts["released"] == 3
    assert report.stopped and "could not reach" in report.stopped
    assert statuses(ledger) == {"retry": 1, "pending": 3}


def runledger(env: dict[str, str], *args: str) -> Result:
    """Run a `runledger` command in this process with ``env`` as its environment."""
    return CliRunner().invoke(app, list(args), env=env)


def test_cli_deliver_reports_a_configuration_error_in_one_line(db_url: str, ledger: Ledger) -> None:
    """`runledger deliver` with a wrong password exits 2 with one clear line, no traceback."""
    queue(ledger, 1)
    with Sink(credentials=("mailer", "right-password")) as sink:
        done = runledger(cli_env(db_url, sink, RUNLEDGER_SMTP_USERNAME="mailer",
                                 RUNLEDGER_SMTP_PASSWORD="s3cret-wrong"), "deliver")
    assert done.exit_code == 2, done.output
    assert "configuration error" in done.stderr and "authentication as mailer" in done.stderr
    assert "Traceback" not in done.output
    assert "s3cret-wrong" not in done.output


def test_cli_deliver_and_requeue(db_url: str, ledger: Ledger) -> None:
    """`runledger deliver` sends what is due; `runledger outbox requeue ID` makes a dead message
    due again, the next `deliver` sends it with the same Message-ID, and `outbox show` lists
    both attempts."""
    [message] = queue(ledger, 1)
    with Sink(faults=[Fault("rcpt", "550")]) as sink:
        env = cli_env(db_url, sink)
        first = runledger(env, "deliver", "--json")
        assert first.exit_code == 0, first.output
        assert json.loads(first.stdout)["dead"] == 1
        requeued = runledger(env, "outbox", "requeue", message.message_id)
        assert requeued.exit_code == 0, requeued.output
        second = runledger(env, "deliver", "--json")
        assert json.loads(second.stdout)["sent"] == 1, second.output
        assert headers_of(sink) == [(message_id_for(message.message_id), message.message_id)]
    history = json.loads(runledger(env, "outbox", "show", message.message_id, "--json").stdout)
    assert history["message"]["status"] == "sent"
    assert [(a["outcome"], a["reply_code"]) for a in history["attempts"]] == [("dead", 550),
                                                                              ("sent", 250)]

"""The ledger's command line on both dialects: db upgrade, runs list/show, outbox list, demo."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from flows.cli import app
from flows.mail.sink import Sink
from flows.registry import get_job
from store import Ledger, OutboxMessage, Run, RunIdentity
from store.errors import LedgerError
from tests.support.delivery import RUNLEDGER, SENDER

PERIOD = datetime(2026, 11, 29, 23, tzinfo=UTC)


def completed_run(ledger: Ledger, subject: str = "team-a") -> str:
    run = ledger.register(RunIdentity("digest", subject, PERIOD, "v1"))
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, [OutboxMessage("ana@example.com", "Digest", "b")])
    return run.run_id


def test_db_upgrade_migrates_an_empty_database_and_creates_the_jobs_tables(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runledger db upgrade` creates the schema on a database that has none, and the tables
    of the jobs that have their own (daily-credit's credits), which no flow run creates."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", empty_db_url)
    ledger = Ledger.connect(empty_db_url)
    try:
        with pytest.raises(LedgerError, match=r"schema is missing.*runledger db upgrade"):
            ledger.runs()
        result = CliRunner().invoke(app, ["db", "upgrade"], catch_exceptions=False)
        assert result.exit_code == 0 and "ledger schema at head" in result.output
        assert "tables of daily-credit" in result.output
        assert ledger.runs() == []
        assert "credits" in sa.inspect(ledger.engine).get_table_names()
    finally:
        ledger.close()


def test_a_command_on_a_ledger_without_its_schema_says_how_to_create_it(
        empty_db_url: str) -> None:
    """The installed `runledger` prints one line naming `runledger db upgrade`, exit 1, no
    traceback."""
    done = subprocess.run([*RUNLEDGER, "runs", "list"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RUNLEDGER_DATABASE_URL": empty_db_url})
    assert done.returncode == 1
    assert "runledger db upgrade" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_runs_list_json_shows_runs_filtered_by_job_and_status(invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`runs list --json` prints the Runs, and --status filters them."""
    done = completed_run(ledger)
    pending = ledger.register(RunIdentity("digest", "team-b", PERIOD, "v1")).run_id
    listed = json.loads(invoke("runs", "list", "--json").output)
    assert {r["run_id"]: r["status"] for r in listed} == {done: "completed", pending: "pending"}
    only = json.loads(invoke("runs", "list", "--status", "pending", "--job", "digest", "--json").output)
    assert [r["run_id"] for r in only] == [pending]


def test_runs_show_json_includes_attempts_and_outbox_rows(invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`runs show RUN_ID --json` shows the Run, its Attempts and its outbox rows."""
    run_id = completed_run(ledger)
    shown = json.loads(invoke("runs", "show", run_id, "--json").output)
    assert shown["run"]["status"] == "completed" and shown["run"]["output"] == {"summary": "ok"}
    assert [a["outcome"] for a in shown["attempts"]] == ["completed"]
    assert [m["recipient"] for m in shown["outbox"]] == ["ana@example.com"]


def test_runs_show_of_an_unknown_run_is_a_one_line_error(invoke: Callable[..., Result]) -> None:
    """An unknown Run id exits 1 with the reason, not a traceback."""
    result = invoke("runs", "show", "0" * 64)
    assert result.exit_code == 1 and "no run with id" in result.output
    assert "Traceback" not in result.output


def test_outbox_list_json_shows_queued_messages(invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`outbox list --json` prints each queued message with its status and key."""
    run_id = completed_run(ledger)
    listed = json.loads(invoke("outbox", "list", "--status", "pending", "--json").output)
    assert [(m["run_id"], m["recipient"], m["status"]) for m in listed] == [
        (run_id, "ana@example.com", "pending")
    ]


def test_an_unknown_status_filter_is_refused(invoke: Callable[..., Result]) -> None:
    """A --status outside the known statuses is a usage error."""
    assert invoke("runs", "list", "--status", "done").exit_code == 2


def test_demo_completes_a_run_once_and_returns_the_duplicate(invoke: Callable[..., Result], db_url: str) -> None:
    """`runledger demo` completes today's demo Run, and repeating it stores nothing new."""
    first = invoke("demo")
    assert first.exit_code == 0, first.output
    assert "new=True" in first.output and "new=False" in first.output
    second = invoke("demo")
    assert second.exit_code == 0 and "status completed" in second.output
    ledger = Ledger.connect(db_url)
    try:
        [run] = ledger.runs(job="demo")
        assert run.status == "completed" and len(ledger.outbox.messages(run_id=run.run_id)) == 1
    finally:
        ledger.close()


def at_80_columns(invoke: Callable[..., Result], *args: str) -> Result:
    return invoke(*args, env={"COLUMNS": "80"})


def reference_run(ledger: Ledger, day: str = "2026-12-01", subject: str = "acme") -> Run:
    """A pending Run of the registered competitor-summary job for ``day`` in its timezone."""
    job = get_job("competitor-summary")
    return ledger.register(job.identity(subject, job.parse_period(day)))


def test_runs_list_at_80_columns_shows_the_job_the_period_label_and_a_short_id_whole(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """Each Run is one line with its 12-character id, the whole job name and the period as the
    user types it (the date in the job's timezone), nothing cut with an ellipsis."""
    runs = [reference_run(ledger, "2026-12-01"), reference_run(ledger, "2026-11-20", "globex")]
    result = at_80_columns(invoke, "runs", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for run, day in zip(runs, ["2026-12-01", "2026-11-20"], strict=True):
        row = next(line for line in lines if run.run_id[:12] in line)
        assert "competitor-summary" in row and day in row and run.run_id[:13] not in row
    assert all(len(line) <= 80 and "…" not in line for line in lines)


def test_runs_list_json_keeps_the_utc_period_start_and_adds_the_label(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """--json has period_start in UTC as before, and `period` as the job's label; a job this
    installation does not know is labelled in UTC."""
    run = reference_run(ledger)
    unknown = completed_run(ledger)
    listed = {r["run_id"]: r for r in json.loads(invoke("runs", "list", "--json").output)}
    start = run.period_start.astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert (listed[run.run_id]["period_start"], listed[run.run_id]["period"]) == (
        start, "2026-12-01")
    assert listed[unknown]["period"] == "2026-11-29T23:00+00:00"
    assert "output" not in listed[unknown] and "raw_input" not in listed[unknown]


def test_runs_show_and_requeue_take_a_unique_prefix_of_the_run_id(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`runs show` finds the Run by its short id and labels its period; `runs requeue` by a
    prefix requeues that Run."""
    run_id = completed_run(ledger)
    shown = at_80_columns(invoke, "runs", "show", run_id[:12])
    assert shown.exit_code == 0, shown.output
    assert f"run id {run_id}" in shown.output and "digest / team-a / 2026-11-29T23:00" in shown.output
    assert "ana@example.com" in shown.output
    assert all(len(line) <= 80 and "…" not in line for line in shown.output.splitlines())
    assert json.loads(invoke("runs", "show", run_id[:6], "--json").output)["run"][
        "run_id"] == run_id
    failed = ledger.register(RunIdentity("digest", "team-b", PERIOD, "v1")).run_id
    claim = ledger.claim(failed, "worker-1:101", 60)
    assert claim is not None
    ledger.fail(claim, "bad input", retryable=False)
    requeued = invoke("runs", "requeue", failed[:8])
    assert requeued.exit_code == 0 and f"run {failed} is pending" in requeued.output


def test_a_prefix_too_short_or_shared_is_a_one_line_error(invoke: Callable[..., Result], ledger: Ledger) -> None:
    """Three characters, or a prefix two Runs share, exits 1 saying what to give instead."""
    by_prefix: dict[str, str] = {}
    for n in range(100_000):
        run_id = RunIdentity("digest", f"team-{n}", PERIOD, "v1").run_id
        if run_id[:4] in by_prefix:
            ledger.register(RunIdentity("digest", by_prefix[run_id[:4]], PERIOD, "v1"))
            ledger.register(RunIdentity("digest", f"team-{n}", PERIOD, "v1"))
            break
        by_prefix[run_id[:4]] = f"team-{n}"
    short = invoke("runs", "show", run_id[:3])
    shared = invoke("runs", "show", run_id[:4])
    assert short.exit_code == shared.exit_code == 1
    assert "too short: give at least 4" in short.output
    assert "2 runs start with it" in shared.output and "give more of its" in shared.output
    assert "Traceback" not in short.output + shared.output


def test_outbox_list_at_80_columns_and_outbox_show_by_a_short_id(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """`outbox list` fits 80 columns with the short id and the whole recipient; `--run` and
    `outbox show` take the short ids it prints."""
    run_id = completed_run(ledger)
    [message] = ledger.outbox.messages(run_id=run_id)
    listed = at_80_columns(invoke, "outbox", "list", "--run", run_id[:12])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if message.message_id[:12] in line)
    assert "ana@example.com" in row and "pending" in row
    assert all(len(line) <= 80 and "…" not in line for line in listed.output.splitlines())
    shown = json.loads(invoke("outbox", "show", message.message_id[:12], "--json").output)
    assert shown["message"]["message_id"] == message.message_id


def test_outbox_list_shows_the_newest_first_with_a_limit_and_whole_long_addresses(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """The newest messages come first, --limit keeps the newest N and says so, and a long
    address is one piece at 80 columns (the subject gives way first)."""
    long_address = "accounts-payable.emea@subsidiary.example.com"
    subjects = [f"team-{n}" for n in range(3)]
    for subject in subjects:
        run = ledger.register(RunIdentity("digest", subject, PERIOD, "v1"))
        claim = ledger.claim(run.run_id, "worker-1:101", 60)
        assert claim is not None
        ledger.complete(claim, {"summary": "ok"},
                        [OutboxMessage(long_address, f"Digest for {subject}", "b")])
    newest = ledger.outbox.recent_messages(limit=3)
    created = [m.created_at for m in newest]
    assert None not in created and created == sorted(created, reverse=True)  # type: ignore[type-var]
    listed = at_80_columns(invoke, "outbox", "list", "--limit", "2")
    lines = listed.output.splitlines()
    rows = [line for line in lines if long_address in line]
    assert [m.message_id[:12] for m in newest[:2]] == [
        next(w for w in row.replace("│", " ").split() if len(w) == 12) for row in rows]
    assert all(len(line) <= 80 for line in lines) and len(rows) == 2
    assert "the newest 2; older ones with a larger --limit" in listed.output


def test_stats_at_80_columns_keeps_the_job_name_on_one_line(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """A job name is never wrapped onto two lines, whatever else must go."""
    run = reference_run(ledger, "2026-12-01")
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, [OutboxMessage("ana@example.com", "D", "b")])
    shown = at_80_columns(invoke, "stats", "--since", "2026-11-01")
    assert shown.exit_code == 0, shown.output
    assert "competitor-summary" in shown.output
    assert all(len(line) <= 80 for line in shown.output.splitlines())


def webhook_run(ledger: Ledger, subject: str) -> str:
    """A completed Run of ``subject`` with one email and one webhook to the same endpoint as
    every other such Run."""
    run = ledger.register(RunIdentity("digest", subject, PERIOD, "v1"))
    claim = ledger.claim(run.run_id, "worker-1:101", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, [
        OutboxMessage("ana@example.com", f"Digest for {subject}", "b"),
        OutboxMessage.webhook("reports-api", {"subject": subject})])
    return run.run_id


def test_outbox_list_says_which_run_each_webhook_is_for(
        invoke: Callable[..., Result], ledger: Ledger) -> None:
    """Two Runs' webhooks to one endpoint: the same target and subject on both rows, told apart
    by the "for" column (job, subject, period)."""
    ids = {subject: webhook_run(ledger, subject) for subject in ("team-a", "team-b")}
    listed = invoke("outbox", "list", "--channel", "webhook", env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "for" in listed.output.splitlines()[1].replace("┃", " ").split()
    for subject, run_id in ids.items():
        [row] = [line for line in listed.output.splitlines() if run_id[:12] in line]
        cells = [c.strip() for c in row.split("│")]
        assert "reports-api" in cells and f"digest {subject} 2026-11-29T23:00+00:00" in cells


def test_deliver_names_the_channels_whose_messages_it_leaves_waiting(
        invoke: Callable[..., Result], ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Webhooks queued while RUNLEDGER_DELIVERY_CHANNELS=email: `deliver` sends the emails and
    prints a "not delivered:" line with the count and the fix; the webhooks stay pending."""
    for subject in ("team-a", "team-b"):
        webhook_run(ledger, subject)
    with Sink() as sink:
        monkeypatch.setenv("RUNLEDGER_SMTP_HOST", sink.host)
        monkeypatch.setenv("RUNLEDGER_SMTP_PORT", str(sink.port))
        monkeypatch.setenv("RUNLEDGER_SMTP_TLS", "none")
        monkeypatch.setenv("RUNLEDGER_MAIL_FROM", SENDER)
        monkeypatch.setenv("RUNLEDGER_DELIVERY_CHANNELS", "email")
        done = invoke("deliver", env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert len(sink.messages) == 2
    assert ("not delivered: 2 webhook message(s) wait in the outbox: "
            "RUNLEDGER_DELIVERY_CHANNELS=email does not deliver webhook; add it (or run deliver "
            "--channel webhook)") in done.stdout
    assert {m.status for m in ledger.outbox.messages(channel="webhook")} == {"pending"}

"""Batch mode killed at each of its fault points: a real `runledger run --batch` or `runledger
batches poll` process SIGKILLed right after a batch's intent commit, its file upload, the
provider's create (its id not stored), mid-download of the results, mid-settlement and after
the settlement commit; then polls until every Run completes. On both ledgers: the provider saw
one create per batch key, each request answered once, every Run completed with its emails
queued once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest

from bench.anthropic_batch_provider import AnthropicBatchServer
from bench.batch_provider import BatchServer
from flows.settle.flow import settle_batches
from tests.support.killed import run_killed
from tests.support.pipeline import ACME, RUNLEDGER, SUMMARY, Env, final_state, wait_until

PERIOD = "2026-12-01"
LEASE_SECONDS = 10
SUBJECTS = ("acme", "globex")
# Where each point is reached: in the tick that submits (run --batch) or in the poll.
TICK_POINTS = ("after_batch_intent_commit", "after_batch_upload", "after_batch_create")
POLL_POINTS = ("mid_results_download", "after_settle_results_commit",
               "after_finish_batch_commit")

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("subprocesses_use_the_session_server")]


@pytest.fixture
def selected(env: Env, batch_server: BatchServer) -> BatchServer:
    """The batch server, selected through RUNLEDGER_MODEL=openai; a batch's lease of 10 s, so
    that a killed holder's batch is taken over soon, yet a live poller on a loaded machine
    keeps it through one poll (the lease's length is not under test)."""
    env.set(model="openai", model_base_url=batch_server.base_url, model_name="probe-model",
            model_api_key="sk-test", batch_lease_seconds=LEASE_SECONDS)
    return batch_server


def run_batch_tick(faults: str | None = None,
                   subjects: tuple[str, ...] = SUBJECTS) -> subprocess.CompletedProcess[str]:
    """`runledger run competitor-summary --batch` for ``subjects``, killed at ``faults``."""
    env = dict(os.environ)
    if faults:
        env["RUNLEDGER_FAULTS"] = faults
    args = [*RUNLEDGER, "run", SUMMARY, "--batch", "--period", PERIOD, "--json"]
    for subject in subjects:
        args += ["--subject", subject]
    return run_killed(args, env, timeout=180)


def poll_killed(faults: str) -> int:
    """`runledger batches poll`, killed at ``faults``; its exit status."""
    env = {**os.environ, "RUNLEDGER_FAULTS": faults}
    return run_killed([*RUNLEDGER, "batches", "poll"], env, timeout=180).returncode


def poll_due(env: Env) -> bool:
    """A poll can act on every batch and queued call: no batch is leased (a killed holder's
    lease ended; a live poll gives its lease back) and no call queued outside a batch is younger
    than a batch lease. Read from the ledger, so that the settle flow runs only when due
    instead of back to back while a dead holder's lease runs out."""
    now = env.ledger.now()
    lease = timedelta(seconds=LEASE_SECONDS)
    leased = [b for b in env.ledger.batches.list_batches(limit=10)
              if b.lease_expires_at is not None and b.lease_expires_at > now]
    young = [c for c in env.calls() if c["outcome"] == "queued" and c["batch_key"] is None
             and c["started_at"] > now - lease]
    return not leased and not young


def poll_until(env: Env, done: Callable[[], bool], what: str) -> None:
    """Run the settle-batches flow in this process whenever a poll is due, until ``done``."""
    def polled() -> bool:
        if not done() and poll_due(env):
            final_state(settle_batches(return_state=True))
        return done()

    wait_until(polled, 240, what)


def poll_until_completed(env: Env) -> None:
    """Poll until every Run of the tick completed (a killed holder's batch is taken over once
    its lease ended)."""
    def completed() -> bool:
        runs = env.ledger.runs(job=SUMMARY)
        return len(runs) == len(SUBJECTS) and all(r.status == "completed" for r in runs)

    poll_until(env, completed, "every Run of the batch tick completed by polls")


def assert_settled_once(env: Env, server: BatchServer) -> None:
    """One create per batch key, one answered call per Run, every Run completed with its
    emails queued once."""
    assert server.creates_by_key and set(server.creates_by_key.values()) == {1}, \
        server.creates_by_key
    calls = env.calls()
    assert Counter(c["outcome"] for c in calls) == {"answered": len(SUBJECTS)}, calls
    assert len({c["custom_id"] for c in calls}) == len(SUBJECTS)
    acme = next(r for r in env.ledger.runs(job=SUMMARY) if r.subject == "acme")
    recipients = sorted(m.recipient for m in env.ledger.outbox.messages(run_id=acme.run_id,
                                                                         limit=10))
    assert recipients == ACME


@pytest.mark.parametrize("point", TICK_POINTS)
def test_a_batch_tick_killed_while_submitting_leaves_one_batch_that_polls_settle_once(
        env: Env, selected: BatchServer, point: str) -> None:
    """The submitting tick dies at ``point``: the Runs wait, the batch is taken over by a
    poll (found at the provider by its key when it was created), created once, settled once."""
    done = run_batch_tick(point)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert {r.status for r in env.ledger.runs(job=SUMMARY)} == {"waiting"}
    poll_until_completed(env)
    assert_settled_once(env, selected)


def test_a_call_queued_by_a_tick_killed_before_its_batch_opened_is_submitted_by_a_poll(
        env: Env, selected: BatchServer) -> None:
    """The tick dies right after its only Run started waiting, its call queued in no batch:
    once the call has waited longer than a batch lease, a poll puts it in a batch (created
    once), and later polls settle it and complete the Run; nothing waits forever."""
    done = run_batch_tick("after_wait_for_batch_commit", subjects=("acme",))
    assert done.returncode == -signal.SIGKILL, done.stderr
    [run] = env.ledger.runs(job=SUMMARY)
    assert run.status == "waiting" and env.ledger.batches.list_batches(limit=10) == []
    def completed() -> bool:
        return env.ledger.get(run.run_id).status == "completed"

    poll_until(env, completed, "the Run of the killed tick completed by polls")
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert batch.flow_run_id is None and batch.status == "settled" and batch.answered == 1
    assert set(selected.creates_by_key.values()) == {1} and len(selected.created) == 1
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": 1}


@pytest.mark.parametrize("point", POLL_POINTS)
def test_a_poll_killed_while_settling_leaves_each_result_settled_once(
        env: Env, selected: BatchServer, point: str) -> None:
    """The tick submits; the first poll dies at ``point``; later polls settle every result
    once and complete every Run."""
    done = run_batch_tick()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["state"] == "AwaitingBatch" and len(report["batches"]) == 1, report
    assert poll_killed(point) == -signal.SIGKILL
    poll_until_completed(env)
    assert_settled_once(env, selected)


def test_an_anthropic_tick_killed_after_its_create_leaves_one_batch_found_by_time_and_size(
        env: Env, anthropic_server: AnthropicBatchServer) -> None:
    """Anthropic's batches carry no key: the tick dies once the create returned, its id not
    stored; the poll that takes the batch over adopts the batch created since its intent with
    as many requests, creates none, and later polls settle it once."""
    env.set(model="anthropic", model_base_url=anthropic_server.base_url,
            model_name="probe-model", model_api_key="sk-ant", batch_lease_seconds=LEASE_SECONDS)
    done = run_batch_tick("after_batch_create")
    assert done.returncode == -signal.SIGKILL, done.stderr
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert batch.provider_batch_id is None and len(anthropic_server.created) == 1
    poll_until_completed(env)
    [batch] = env.ledger.batches.list_batches(limit=10)
    assert batch.provider_batch_id == anthropic_server.created[0]
    assert len(anthropic_server.created) == 1
    assert Counter(c["outcome"] for c in env.calls()) == {"answered": len(SUBJECTS)}

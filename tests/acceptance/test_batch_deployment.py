"""Batch mode from a deployment on a work pool, on the acceptance stack (a real Prefect server
on PostgreSQL, `prefect deploy`, two process workers, the SMTP sink, a PostgreSQL ledger) with
an OpenAI Files + Batches server on loopback: a Custom run of competitor-summary with
``batch: true`` queues its calls and its flow run ends Paused as AwaitingBatch, its process
gone (the worker free); a settle-batches run while the provider still works changes nothing;
the next one settles the batch, runs the Runs again in a subflow and completes the tick; one
delivery pass sends each email once."""

from __future__ import annotations

import json
from uuid import UUID

import pytest

from bench.batch_provider import BatchServer
from flows.jobs.competitor_summary import subscribers, workspaces
from flows.registry import get_job
from tests.support.stack import AcceptanceStack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

SUMMARY = "competitor-summary"
PERIOD = "2026-10-07"  # a period no other acceptance test runs


def state_name(stack: AcceptanceStack, flow_run_id: UUID) -> str | None:
    state = stack.flow_run(flow_run_id).state
    return None if state is None else state.name


def test_a_batch_tick_from_a_deployment_frees_its_worker_and_a_later_poll_completes_it(
        stack: AcceptanceStack) -> None:
    """Paused as AwaitingBatch with every Run waiting (no lease, no process); the first poll
    finds the batch in progress; the second settles it, completes every Run and the tick's
    flow run; each subscriber gets one email; the provider saw one create."""
    job = get_job(SUMMARY)
    subjects = workspaces()
    with BatchServer() as server:
        server.polls_until_done = 1
        env = {"RUNLEDGER_MODEL": "openai", "RUNLEDGER_MODEL_BASE_URL": server.base_url,
               "RUNLEDGER_MODEL_NAME": "gpt-batch", "RUNLEDGER_MODEL_API_KEY": "sk-test",
               "RUNLEDGER_MODEL_CURRENCY": "USD", "RUNLEDGER_MODEL_PRICES": json.dumps(
                   {"gpt-batch": {"input": "2.50", "output": "10.00"}})}
        tick = stack.run(SUMMARY, {"period": PERIOD, "batch": True}, env=env)
        wait_until(lambda: state_name(stack, tick) == "AwaitingBatch", 180,
                   f"tick flow run {tick} to end Paused as AwaitingBatch")
        run = stack.flow_run(tick)
        assert run.state is not None and run.state.is_paused()
        start = job.parse_period(PERIOD).start
        with stack.ledger() as ledger:
            runs = [r for r in ledger.runs(job=SUMMARY, limit=1000) if r.period_start == start]
            [batch] = [b for b in ledger.batches.list_batches(limit=100)
                       if b.flow_run_id == str(tick)]
        assert sorted(r.subject for r in runs) == sorted(subjects)
        assert {(r.status, r.owner) for r in runs} == {("waiting", None)}
        assert str(batch.provider_batch_id) in (run.state.message or "")

        first = stack.wait_final(stack.run("settle-batches", env=env))
        assert first.state is not None and first.state.is_completed(), first.state
        assert state_name(stack, tick) == "AwaitingBatch"
        second = stack.wait_final(stack.run("settle-batches", env=env))
        assert second.state is not None and second.state.is_completed(), second.state
        ended = stack.flow_run(tick).state
        assert ended is not None and ended.is_completed(), ended

    with stack.ledger() as ledger:
        runs = [r for r in ledger.runs(job=SUMMARY, limit=1000) if r.period_start == start]
    assert {r.status for r in runs} == {"completed"}
    assert set(server.creates_by_key.values()) == {1}
    stack.deliver()
    sent = sorted(str(m["To"]) for m in stack.mail() if str(m["Subject"]).endswith(PERIOD))
    assert sent == sorted(r for s in subjects for r in subscribers(s))

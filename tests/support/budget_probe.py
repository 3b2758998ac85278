"""A job with a budget that worker subprocesses can load (``probe(name, calls)`` registers it):
the reconcile probe's stages (one model call per subject) for three subjects per call its
budget has room for, in tokens, each call estimated at what the loopback model server reports
it used. Each test names its own job, so that its budget window is its own."""

from __future__ import annotations

from flows.jobs import Job
from flows.jobs.budget import Budget
from tests.support import reconcile_probe
from tests.support.pipeline import USAGE

ENV = "RUNLEDGER_TEST_BUDGET_PROBE"  # the job's name
CALLS = "RUNLEDGER_TEST_BUDGET_CALLS"  # how many calls its budget has room for
LOAD = (f"import os; from tests.support.budget_probe import probe; "
        f"probe(os.environ[{ENV!r}], int(os.environ[{CALLS!r}])); "
        f"from flows.cli import main; main()")
CALL_TOKENS = USAGE["total_tokens"]  # what every answer of tests.support.pipeline's server used


def probe(name: str, calls: int) -> Job:
    """Register (and return) the budget probe called ``name``: 3 x ``calls`` subjects, a budget
    of ``calls`` calls per period."""
    return reconcile_probe.probe(
        name, subjects=[f"s{i}" for i in range(3 * calls)],
        budget=Budget(per_period=calls * CALL_TOKENS, unit="tokens", call_estimate=CALL_TOKENS))

"""A budget that must hold as a cap, against a server that bills every call its bound: a job
that worker subprocesses can load (``probe(name, calls)`` registers it), whose budget in money
has room for ``calls`` calls' bound exactly, and an OpenAI-compatible server on loopback whose
answers report the most a call can use (prompt tokens as many as the messages' UTF-8 bytes plus
the chat overhead, the most a byte-level tokenizer counts; completion tokens the ``max_tokens``
the request asked for): each answer costs exactly what its call reserved, the adversarial case."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from bench.loopback import Answer, Request, json_answer
from bench.structured import answer_text
from flows.jobs import Job
from flows.jobs.budget import Budget
from flows.model import CallBound, call_bound
from flows.model.bound import byte_bound
from flows.prices import ModelPrice, PriceList, money
from tests.support import reconcile_probe
from tests.support.pipeline import ModelServer

ENV = "RUNLEDGER_TEST_CAP_PROBE"  # the job's name
CALLS = "RUNLEDGER_TEST_CAP_CALLS"  # how many calls' bound its budget has room for
LOAD = (f"import os; from tests.support.cap_probe import probe; "
        f"probe(os.environ[{ENV!r}], float(os.environ[{CALLS!r}])); "
        f"from flows.cli import main; main()")
MODEL = "probe-model"
MAX_TOKENS = 64
PRICES = PriceList(currency="USD", prices={MODEL: ModelPrice(input=Decimal(1), output=Decimal(4))})
SUBJECTS = [f"s{i:02d}" for i in range(24)]  # names of one length: every call has one bound


def _bound() -> CallBound:
    # Every subject's prompt has the same length, whatever the day: one bound for every call.
    text = reconcile_probe.collect_text("s00", "2026-01-01")
    return call_bound(MODEL, text, reconcile_probe.SYSTEM, MAX_TOKENS)


def call_cost() -> int:
    """What one call of the probe reserves and costs, in billionths of USD: its bound priced."""
    cost = _bound().cost_nanos(PRICES, MODEL)
    assert cost is not None
    return cost


def call_tokens() -> int:
    """The tokens one call of the probe takes of its endpoint's tokens per minute."""
    return _bound().tokens


def settings() -> dict[str, Any]:
    """The RUNLEDGER_* settings (lower case, without the prefix) of the probe's model."""
    return {"model_name": MODEL, "model_max_tokens": MAX_TOKENS, "model_currency": "USD",
            "model_prices": json.dumps({MODEL: {"input": "1", "output": "4"}})}


def probe(name: str, calls: float, call_estimate: Decimal | None = None,
          subjects: list[str] = SUBJECTS) -> Job:
    """Register (and return) the cap probe called ``name``: a budget per period of ``calls``
    calls' cost (a fraction: less than one call)."""
    cap = money(round(calls * call_cost()))
    return reconcile_probe.probe(name, subjects=subjects,
                                 budget=Budget(per_period=cap, call_estimate=call_estimate))


class BillingServer(ModelServer):
    """Answers every request after ``delay`` seconds, billed its bound: prompt tokens the byte
    bound of its messages, completion tokens its ``max_tokens`` plus ``beyond`` (a provider
    that does not honour max_tokens bills more)."""

    def __init__(self, delay: float = 0.0, beyond: int = 0) -> None:
        super().__init__()
        self.delay = delay
        self.beyond = beyond

    def answer(self, request: Request) -> Answer:
        count, asked, _ = self.next_reply(request)
        usage = {"prompt_tokens": byte_bound([m["content"] for m in asked["messages"]]),
                 "completion_tokens": asked["max_tokens"] + self.beyond}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return json_answer(200, {"model": MODEL, "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant",
                                     "content": answer_text(asked, f"answer {count}")}}]},
            delay=self.delay)

"""The model a job's transform receives for one Run: every call is recorded in the ledger before
it leaves (fenced by the Attempt's lease), its answer checkpointed when it arrives, and a
repeated transform replays the recorded answers of the calls it repeats (by their position in
the transform and their prompt's digest) instead of paying for them again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flows.model.bound import INPUT_BOUND, CallBound, InputBound, call_bound
from flows.model.errors import EndpointRefusing, ModelRejected, ModelUnavailable
from flows.model.limiter import EndpointLimiter
from flows.model.protocol import Generation, Model
from flows.prices import PriceList
from store import (
    AFTER_MODEL_ANSWER,
    CallBook,
    Charge,
    Claim,
    InFlight,
    Intent,
    Usage,
    document_digest,
    fault_point,
)


class Budgeting(Protocol):
    """What a call asks of its job's budget (``flows.jobs.budget.Estimator``)."""

    def charge(self, model: str, bound: CallBound) -> Charge:
        """The reservation of a call of ``model`` whose use is at most ``bound``."""
        ...


# Told of each answer billed beyond its call's bound: the call's id, the bound and the usage.
Overran = Callable[[str, CallBound, Usage], None]


def prompt_digest(model: str, prompt: str, system: str | None) -> str:
    """sha256 of what decides a call's answer: the model, the system text and the prompt."""
    return document_digest({"model": model, "system": system, "prompt": prompt}, "prompt")


@dataclass
class CallCount:
    """What one Attempt's transform did with the model, across the retries of its stage (one
    subject's stages run in one thread at a time): calls that left, and answers replayed."""

    value: int = 0
    reused: int = 0
    tokens: int = 0
    cost_nanos: int = 0
    unpriced: int = 0  # calls that answered without a price (or without usage)
    call_ids: list[str] = field(default_factory=list)
    # Each call's record as this attempt wrote it to the ledger (outcome, tokens, cost; no
    # outcome while in flight, or when the ledger could not take its end).
    records: list[dict[str, Any]] = field(default_factory=list)


class RecordedModel:
    """A Model that records each call of one Run's transform in the ledger, then delegates.

    With a ``limiter``, calls are recorded under its endpoint's name once its shared limits
    allow them, and a call the provider refuses (429) is tried again in this process after
    the pause every worker then observes, as long as the refusals last at most
    ``refused_for_seconds``; longer, it ends as ``EndpointRefusing`` (transient).

    Each call's bound (its input tokens bounded, plus the inner model's ``max_tokens``) is what
    its budget charge and its endpoint's tokens take before it leaves; an answer billed beyond
    it is recorded with its overrun and told to ``overran``."""

    def __init__(self, inner: Model, calls: CallBook, claim: Claim, prices: PriceList,
                 count: CallCount, *, budgeting: Budgeting | None = None,
                 limiter: EndpointLimiter | None = None,
                 refused_for_seconds: float = 300.0, overran: Overran | None = None,
                 inputs: InputBound = INPUT_BOUND) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_tokens = inner.max_tokens
        self.endpoint = inner.endpoint if limiter is None else limiter.name
        self.limiter = limiter
        self.refused_for_seconds = refused_for_seconds
        self.calls = calls
        self.claim = claim
        self.prices = prices
        self.count = count
        self.budgeting = budgeting
        self.overran = overran
        self.inputs = inputs
        self.position = 0
        # A first claim (fence 1) has no earlier attempt whose calls it could replay or lose.
        self._replaying = claim.fence > 1
        self._lost_marked = False

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        position = self.position
        self.position += 1
        digest = prompt_digest(self.inner.name, prompt, system)
        if self._replaying:
            replayed = self._replay(position, digest)
            if replayed is not None:
                return replayed
        bound = call_bound(self.inner.name, prompt, system, self.inner.max_tokens, self.inputs)
        charge = None if self.budgeting is None else self.budgeting.charge(self.inner.name, bound)
        refused_since: float | None = None
        while True:
            call, record = self._record(Intent(self.endpoint, self.inner.name, position,
                                               digest, charge), bound)
            started = time.monotonic()
            try:
                answer = self.inner.generate(prompt, system=system)
                break
            except (ModelUnavailable, ModelRejected) as exc:
                outcome = "refused" if exc.status is not None else "failed"
                self.calls.record_failure(call, outcome, str(exc),
                                          Usage(latency_ms=_since(started)))
                record["outcome"] = outcome
                if self.limiter is None or not isinstance(exc, ModelUnavailable) \
                        or not exc.rate_limited:
                    raise
                self.limiter.refused(call, exc.retry_after)  # every worker pauses
                refused_since = refused_since or started
                if time.monotonic() - refused_since > self.refused_for_seconds:
                    raise EndpointRefusing(
                        f"endpoint {self.endpoint} kept refusing for more than "
                        f"{self.refused_for_seconds:g} s (RUNLEDGER_MODEL_REFUSED_FOR_SECONDS); "
                        f"last: {exc}") from exc
            except Exception as exc:
                self.calls.record_failure(call, "failed", f"{type(exc).__name__}: {exc}",
                                          Usage(latency_ms=_since(started)))
                record["outcome"] = "failed"
                raise
        fault_point(AFTER_MODEL_ANSWER)  # paid for, and nothing of it stored yet
        cost = self.prices.cost_nanos(answer.model, answer.prompt_tokens,
                                      answer.completion_tokens)
        if cost is None:
            cost = self.prices.cost_nanos(self.inner.name, answer.prompt_tokens,
                                          answer.completion_tokens)
        usage = Usage(answer.prompt_tokens, answer.completion_tokens, _since(started), cost,
                      self.prices.currency if cost is not None else None,
                      bound.overrun(answer.prompt_tokens, answer.completion_tokens))
        self.calls.record_answer(call, _document(answer), usage)
        record.update(outcome="answered", **usage.params())
        if self.limiter is not None:
            self.limiter.answered(call, usage)
        if usage.overrun and self.overran is not None:
            self.overran(call.call_id, bound, usage)
        self.count.tokens += usage.tokens
        if cost is None:
            self.count.unpriced += 1
        else:
            self.count.cost_nanos += cost
        return answer

    def _record(self, intent: Intent, bound: CallBound) -> tuple[InFlight, dict[str, Any]]:
        """Record the call in flight (once its endpoint's limits allow it) and count it; its
        entry in the count's records (its outcome and usage once known)."""
        call = (self.calls.record_intent(self.claim, intent) if self.limiter is None
                else self.limiter.record(self.claim, intent, bound.tokens))
        self.count.value += 1
        self.count.call_ids.append(call.call_id)
        record: dict[str, Any] = {"outcome": None}
        self.count.records.append(record)
        return call, record

    def _replay(self, position: int, digest: str) -> Generation | None:
        if not self._lost_marked:
            self.calls.mark_lost(self.claim.run_id)
            self._lost_marked = True
        checkpoint = self.calls.replay(self.claim, position, digest)
        if checkpoint is None:
            return None
        self.count.reused += 1
        return _generation(checkpoint.answer)

    def close(self) -> None:
        """The inner model outlives one Run: the flow run closes it."""


def _since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def _document(answer: Generation) -> dict[str, object]:
    return {"text": answer.text, "model": answer.model, "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens}


def _generation(document: dict[str, object]) -> Generation:
    def tokens(key: str) -> int | None:
        value = document.get(key)
        return value if isinstance(value, int) else None

    return Generation(str(document["text"]), str(document["model"]), tokens("prompt_tokens"),
                      tokens("completion_tokens"))

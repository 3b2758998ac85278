"""The model a job's transform receives for one Run: every call is recorded in the ledger before
it leaves (fenced by the Attempt's lease), its answer checkpointed when it arrives, and a
repeated transform replays the recorded answers of the calls it repeats (by their position in
the transform and their request's digest) instead of paying for them again. In a batch tick a
call is queued for its provider's Batch API instead of sent (``BatchQueue``): recorded with the
request its provider will be sent, and the transform stops there (``QueuedForBatch``); the
batch's answer is checkpointed when it is settled, and replayed by the Run's next attempt."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from flows.errors import ValidationFailed
from flows.model.asking import answer_of, parameters_of, plain_prompt, request_of
from flows.model.bound import INPUT_BOUND, CallBound, InputBound, request_bound
from flows.model.errors import (
    EndpointRefusing,
    InvalidModelRequest,
    ModelRefused,
    ModelRejected,
    ModelUnavailable,
    QueuedForBatch,
)
from flows.model.limiter import EndpointLimiter
from flows.model.protocol import Generation, ModelClient
from flows.model.request import Message, Request
from flows.prices import PriceList
from store import (
    AFTER_MODEL_ANSWER,
    AlreadyAnswered,
    AlreadyQueued,
    CallBook,
    Charge,
    Claim,
    InFlight,
    Intent,
    Queued,
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
    """sha256 of what decides a plain call's answer: the model, the system text and the prompt."""
    return document_digest({"model": model, "system": system, "prompt": prompt}, "prompt")


def request_digest(model: str, request: Request) -> str:
    """sha256 of everything that decides a call's answer (``Request.shape``: messages,
    parameters, output schema, model); a plain prompt and system text keep ``prompt_digest``,
    so that answers checkpointed before requests had more replay as before."""
    plain = plain_prompt(request)
    if plain is not None:
        return prompt_digest(model, *plain)
    return document_digest(request.shape(model), "request")


def custom_id_of(run_id: str, position: int, digest: str) -> str:
    """A queued call's id in its batch, from its Run, position and request digest: the same
    call queued again has the same id; letters, digits and dashes, at most 64 (what OpenAI and
    Anthropic both take)."""
    return f"{run_id[:32]}-{position}-{digest[:16]}"


@dataclass(frozen=True)
class BatchQueue:
    """Where a batch tick's calls go instead of leaving: the endpoint whose next batch takes
    them, how its provider writes one request (``BatchClient.line``) and the tick's flow run
    (the one the poll ends once none of its calls waits) and the endpoint's enqueued-token
    limit (None: none)."""

    endpoint: str
    line: Callable[[Request], dict[str, Any]]
    flow_run_id: str | None = None
    queue_tokens: int | None = None


@dataclass
class CallCount:
    """What one Attempt's transform did with the model, across the retries of its stage (one
    subject's stages run in one thread at a time): calls that left, and answers replayed."""

    made: int = 0  # calls recorded and sent (not replayed)
    reused: int = 0
    queued: int = 0  # calls queued for a batch (recorded, not sent)
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
    it is recorded with its overrun and told to ``overran``.

    With a ``batch`` queue, a call without a checkpoint is queued for the endpoint's next batch
    (its budget charge reserved, no endpoint slot: a batch does not spend the synchronous
    limits) and ``QueuedForBatch`` ends the transform; ``queued`` then stays True, whatever the
    transform did with the exception."""

    def __init__(self, inner: ModelClient, book: CallBook, claim: Claim, prices: PriceList,
                 spent: CallCount, *, budgeting: Budgeting | None = None,
                 limiter: EndpointLimiter | None = None,
                 refused_for_seconds: float = 300.0, overran: Overran | None = None,
                 inputs: InputBound = INPUT_BOUND, batch: BatchQueue | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_tokens = inner.max_tokens
        self.endpoint = inner.endpoint if limiter is None else limiter.name
        self.limiter = limiter
        self.refused_for_seconds = refused_for_seconds
        self.book = book
        self.claim = claim
        self.prices = prices
        self.spent = spent
        self.budgeting = budgeting
        self.overran = overran
        self.inputs = inputs
        self.batch = batch
        self.queued = False
        self.position = 0
        # A first claim (fence 1) has no earlier attempt whose calls it could replay or lose.
        self._replaying = claim.fence > 1
        self._lost_marked = False

    def generate(self, prompt: str | None = None, *, system: str | None = None,
                 messages: Sequence[Message] | None = None, output: type[BaseModel] | None = None,
                 temperature: float | None = None, max_tokens: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] | None = None) -> Generation:
        """Answer as ``Model.generate`` does: a request that cannot be sent is refused before
        anything is recorded; the answer, new or replayed, is checked by ``answer_of``."""
        request = request_of(prompt, system=system, messages=messages, output=output,
                             parameters=parameters_of(temperature, max_tokens, top_p, seed, stop),
                             max_tokens=self.inner.max_tokens)
        position = self.position
        self.position += 1
        digest = request_digest(self.inner.name, request)
        if self._replaying:
            replayed = self._replay(position, digest)
            if replayed is not None:
                return self._checked(request, replayed)
        if self.batch is not None:
            return self._checked(request, self._queue(self.batch, request, position, digest))
        return self._checked(request, self._call(request, position, digest))

    def _checked(self, request: Request, answer: Generation) -> Generation:
        """``answer_of``; an answer it rejects (a refusal, structured output that does not
        validate) stays in the ledger as evidence, never to be replayed."""
        try:
            return answer_of(request, answer)
        except (ModelRefused, ValidationFailed):
            self.book.reject_answers(self.claim)
            raise

    def _call(self, request: Request, position: int, digest: str) -> Generation:
        """Record the call, send it and checkpoint its answer (a refusal is an answer)."""
        bound = request_bound(self.inner.name, request, self.inner.max_tokens, self.inputs)
        charge = None if self.budgeting is None else self.budgeting.charge(self.inner.name, bound)
        refused_since: float | None = None
        while True:
            call, record = self._record(Intent(self.endpoint, self.inner.name, position,
                                               digest, charge), bound)
            started = time.monotonic()
            try:
                answer = self.inner.complete(request)
                break
            except (ModelUnavailable, ModelRejected) as exc:
                outcome = "refused" if exc.status is not None else "failed"
                self.book.record_failure(call, outcome, str(exc),
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
                self.book.record_failure(call, "failed", f"{type(exc).__name__}: {exc}",
                                         Usage(latency_ms=_since(started)))
                record["outcome"] = "failed"
                raise
        fault_point(AFTER_MODEL_ANSWER)  # paid for, and nothing of it stored yet
        usage = usage_of(answer, self.prices, self.inner.name, _since(started),
                         bound.overrun(answer.prompt_tokens, answer.completion_tokens))
        cost = usage.cost_nanos
        self.book.record_answer(call, answer_document(answer), usage)
        record.update(outcome="answered", **usage.params())
        if self.limiter is not None:
            self.limiter.answered(call, usage, answer.announced)
        if usage.overrun and self.overran is not None:
            self.overran(call.call_id, bound, usage)
        self.spent.tokens += usage.tokens
        if cost is None:
            self.spent.unpriced += 1
        else:
            self.spent.cost_nanos += cost
        return answer

    def _queue(self, batch: BatchQueue, request: Request, position: int,
               digest: str) -> Generation:
        """Queue the call for the endpoint's next batch (recorded with the request its provider
        is sent, its charge reserved at the batch price), then end the transform. A call this
        Run queued already (an attempt that stopped before its Run waited) is not queued twice;
        one its batch answered since this attempt looked for a checkpoint is replayed."""
        bound = request_bound(self.inner.name, request, self.inner.max_tokens, self.inputs)
        if batch.queue_tokens is not None and bound.input_tokens > batch.queue_tokens:
            raise InvalidModelRequest(
                f"model call {position} of run {self.claim.run_id} holds up to "
                f"{bound.input_tokens} prompt tokens, more than endpoint {batch.endpoint}'s "
                f"enqueued-token limit for batches ({batch.queue_tokens}): it could never enter "
                "a batch; shorten its prompt, raise the endpoint's batch_queue_tokens, or run "
                "the job without batch")
        was_queued, self.queued = self.queued, True
        charge = None if self.budgeting is None else self.budgeting.charge(self.inner.name, bound)
        custom_id = custom_id_of(self.claim.run_id, position, digest)
        try:
            call = self.book.record_intent(self.claim, Intent(
                batch.endpoint, self.inner.name, position, digest, charge,
                queued=Queued(custom_id, batch.line(request), batch.flow_run_id,
                              bound.input_tokens)))
        except AlreadyAnswered as exc:
            self.queued = was_queued
            replayed = self._replay(position, digest)
            if replayed is None:
                raise ModelUnavailable(f"model call {exc.call_id} of run {self.claim.run_id} "
                                       "was answered by its batch and its answer could not be "
                                       "replayed; the Run is tried again") from exc
            return replayed
        except AlreadyQueued as exc:
            call_id = exc.call_id
        else:
            call_id = call.call_id
            self.spent.queued += 1
            self.spent.call_ids.append(call_id)
        raise QueuedForBatch(f"model call {position} of run {self.claim.run_id} is queued for "
                             f"the next batch of endpoint {batch.endpoint} ({custom_id})",
                             call_id)

    def _record(self, intent: Intent, bound: CallBound) -> tuple[InFlight, dict[str, Any]]:
        """Record the call in flight (once its endpoint's limits allow it) and count it; its
        entry in the spend's records (its outcome and usage once known)."""
        call = (self.book.record_intent(self.claim, intent) if self.limiter is None
                else self.limiter.record(self.claim, intent, bound.tokens))
        self.spent.made += 1
        self.spent.call_ids.append(call.call_id)
        record: dict[str, Any] = {"outcome": None}
        self.spent.records.append(record)
        return call, record

    def _replay(self, position: int, digest: str) -> Generation | None:
        if not self._lost_marked:
            self.book.mark_lost(self.claim.run_id)
            self._lost_marked = True
        checkpoint = self.book.replay(self.claim, position, digest)
        if checkpoint is None:
            return None
        self.spent.reused += 1
        return _generation(checkpoint.answer)

    def close(self) -> None:
        """The inner model outlives one Run: the flow run closes it."""


def _since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def usage_of(answer: Generation, prices: PriceList, model: str, latency_ms: int | None,
             overrun: int | None) -> Usage:
    """What an answer used and cost at ``prices``: priced by the model that answered, else by
    ``model``, the one asked (a provider may name a dated snapshot)."""
    cached = {"cached_tokens": answer.cached_tokens,
              "cache_write_tokens": answer.cache_write_tokens}
    cost = prices.cost_nanos(answer.model, answer.prompt_tokens, answer.completion_tokens,
                             **cached)
    if cost is None:
        cost = prices.cost_nanos(model, answer.prompt_tokens, answer.completion_tokens, **cached)
    return Usage(answer.prompt_tokens, answer.completion_tokens, latency_ms, cost,
                 prices.currency if cost is not None else None, overrun, **cached)


def answer_document(answer: Generation) -> dict[str, object]:
    """The checkpoint of an answer: what a later attempt replays."""
    found: dict[str, object] = {
        "text": answer.text, "model": answer.model, "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens}
    if answer.refusal is not None:  # only then, so that answers keep their old documents
        found["refusal"] = answer.refusal
    return found


def _generation(document: dict[str, object]) -> Generation:
    def tokens(key: str) -> int | None:
        value = document.get(key)
        return value if isinstance(value, int) else None

    refusal = document.get("refusal")
    return Generation(str(document["text"]), str(document["model"]), tokens("prompt_tokens"),
                      tokens("completion_tokens"),
                      refusal=refusal if isinstance(refusal, str) else None)

"""A batch's result line as the ledger settles it: an answer checkpointed with its usage and
its cost at the batch price; a permanent error as the call refused (the provider's error
reply) or failed; a transient one (the provider's 429 or 5xx for that line) not settled, so
that the call goes into the next batch."""

from __future__ import annotations

from dataclasses import replace

from flows.model import answer_document, usage_of
from flows.model.batch.protocol import ResultLine
from flows.prices import PriceList
from store import End


def end_of(line: ResultLine, prices: PriceList, model: str) -> End | None:
    """How the line's call ended, priced at the batch price of ``prices`` (the endpoint's),
    with what it would have cost synchronously; None for a transient error: the call is
    queued again."""
    if line.generation is not None:
        usage = usage_of(line.generation, prices.batched(), model, None, None)
        sync = usage_of(line.generation, prices, model, None, None).cost_nanos
        return End("answered", replace(usage, sync_cost_nanos=sync),
                   answer=answer_document(line.generation))
    if line.transient:
        return None
    return End("refused" if line.status is not None else "failed",
               error=line.error or "the batch gave no answer and no error for this request")

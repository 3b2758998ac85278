"""Batch mode's side of the providers: a provider's Batch API as a ``BatchClient`` (lines
built as the synchronous client builds its requests, a file uploaded, a batch created under
our key and found again by it, polled, its result lines read as answers or errors).
Each provider's is imported from its own module (``flows.model.batch.openai``,
``flows.model.batch.anthropic``): see flows.model.providers."""

from flows.model.batch.protocol import (
    BATCH_KEY,
    INLINE,
    BatchClient,
    RemoteBatch,
    ResultLine,
    Sought,
)

__all__ = ["BATCH_KEY", "INLINE", "BatchClient", "RemoteBatch", "ResultLine", "Sought"]

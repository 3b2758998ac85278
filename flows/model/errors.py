"""Model failures, classified for the pipeline's retry policy."""

from __future__ import annotations

from flows.errors import JobError, PermanentError, TransientError
from store import InvalidInput


class ModelUnavailable(TransientError):
    """The model did not answer in time or is overloaded (timeout, 429, 5xx, connection lost)."""

    # The HTTP status of the provider's error reply (a refusal: not billed); None when no
    # reply came (a timeout or a lost connection: the provider may have billed the call).
    status: int | None = None
    # The provider asked every caller to slow down (429, or 503 with a pause hint): the
    # endpoint pauses for every worker and the call is tried again in-process.
    rate_limited: bool = False


class EndpointRefusing(ModelUnavailable):
    """The endpoint kept refusing (429) longer than RUNLEDGER_MODEL_REFUSED_FOR_SECONDS: the
    subject ends as a transient failure for reconcile to re-drive later, without the stage
    retries (they would only call into the same refusal)."""


class ModelRejected(PermanentError):
    """The model refused the request or answered nonsense (4xx, malformed reply)."""

    status: int | None = None  # as ModelUnavailable's; None for a malformed reply


class ModelRefused(ModelRejected):
    """The model answered with a refusal (OpenAI's ``message.refusal``, Anthropic's
    ``stop_reason: refusal``): the call was paid and recorded as answered, and retrying the
    same request would be refused again, so the Run fails."""


class InvalidModelRequest(InvalidInput):
    """A transform asked the model for something it cannot send (no prompt, an unknown role,
    an output that is not a pydantic model, max_tokens out of range): refused before anything
    was recorded or paid."""


class ModelMisconfigured(PermanentError):
    """The model settings are incomplete or invalid."""


class QueuedForBatch(JobError):
    """Not a failure: the transform's model call was queued for its provider's Batch API
    (recorded, not sent), so the Run waits for the batch without a lease or a worker, and
    runs again from its checkpointed answers once the batch is settled."""

    def __init__(self, message: str, call_id: str | None) -> None:
        super().__init__(message)
        self.call_id = call_id

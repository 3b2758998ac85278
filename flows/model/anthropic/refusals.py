"""What an Anthropic error reply means for the pipeline: 429 (``rate_limit_error``) is
``rate_limited``, the endpoint pauses for its ``retry-after``; 529 (``overloaded_error``), 408
and other 5xx are transient; any other 4xx is permanent. An error reply is a refusal: not
billed. The reply's body is quoted, shortened; the API key is never in it."""

from __future__ import annotations

import anthropic

from flows.model.errors import ModelRejected, ModelUnavailable
from flows.retry_after import pause_hint

TRANSIENT_STATUSES = frozenset({408, 429, 529})  # besides 5xx: try again later
MAX_ERROR_BODY = 300
# The HTTP status each of Anthropic's error types is sent with (a batch result line names the
# type only).
STATUS_OF_TYPE = {"invalid_request_error": 400, "authentication_error": 401,
                  "billing_error": 402, "permission_error": 403, "not_found_error": 404,
                  "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                  "timeout_error": 504, "overloaded_error": 529}


def transient(status: int) -> bool:
    """Whether asking again later may succeed where this status was answered."""
    return status in TRANSIENT_STATUSES or status >= 500


def _snippet(error: anthropic.APIStatusError) -> str:
    text = error.response.text.strip().replace("\n", " ")
    return text[:MAX_ERROR_BODY] + ("..." if len(text) > MAX_ERROR_BODY else "")


def refusal(model: str, error: anthropic.APIStatusError) -> ModelUnavailable | ModelRejected:
    """The error a refusal of ``model`` raises: transient (a 429 rate-limited, with the pause
    the provider asked for) or permanent, with its HTTP status."""
    status = error.status_code
    refused: ModelUnavailable | ModelRejected
    if transient(status):
        refused = ModelUnavailable(f"model {model} answered HTTP {status}: {_snippet(error)}",
                                   retry_after=pause_hint(error.response.headers))
        refused.rate_limited = status == 429
    else:
        refused = ModelRejected(
            f"model {model} refused the request with HTTP {status}: {_snippet(error)}")
    refused.status = status
    return refused

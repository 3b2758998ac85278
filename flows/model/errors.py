"""Model failures, classified for the pipeline's retry policy."""

from __future__ import annotations

from flows.jobs.errors import PermanentError, TransientError


class ModelUnavailable(TransientError):
    """The model did not answer in time or is overloaded (timeout, 429, 5xx, connection lost)."""


class ModelRejected(PermanentError):
    """The model refused the request or answered nonsense (4xx, malformed reply)."""


class ModelMisconfigured(PermanentError):
    """The model settings are incomplete or invalid."""

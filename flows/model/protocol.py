"""The Model protocol: what a job's transform may call, whatever answers behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Generation:
    """One model answer: its text, the name of the model that wrote it, and the tokens its
    provider reported for the prompt and the completion (None when it reported none)."""

    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Model(Protocol):
    """Turns a prompt into text. Failures raise ``ModelUnavailable`` (transient: retried) or
    ``ModelRejected`` (permanent: the Run fails). ``endpoint`` names where the calls go (the
    base URL, or ``offline``), as model call records show it; ``max_tokens`` is the most
    tokens an answer may use, asked of the provider with every call (what a budget reserves)."""

    name: str
    endpoint: str
    max_tokens: int

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        """Answer ``prompt``; ``system`` holds the instructions when the model takes them."""
        ...

    def close(self) -> None:
        """Release connections; the model is not used afterwards."""
        ...

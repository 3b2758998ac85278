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
    base URL, or ``offline``), as model call records show it."""

    name: str
    endpoint: str

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        """Answer ``prompt``; ``system`` holds the instructions when the model takes them."""
        ...

    def close(self) -> None:
        """Release connections; the model is not used afterwards."""
        ...

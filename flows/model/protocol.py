"""The Model protocol: what a job's transform may call, whatever answers behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Generation:
    """One model answer: its text and the name of the model that wrote it."""

    text: str
    model: str


class Model(Protocol):
    """Turns a prompt into text. Failures raise ``ModelUnavailable`` (transient: retried) or
    ``ModelRejected`` (permanent: the Run fails)."""

    name: str

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        """Answer ``prompt``; ``system`` holds the instructions when the model takes them."""
        ...

    def close(self) -> None:
        """Release connections; the model is not used afterwards."""
        ...

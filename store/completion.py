"""A Completion: the Run's accepted output with its outbox rows and, optionally, the job's
business effect, committed together; what the completing Attempt records of itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from store.models import Run
from store.validators import check_calls

# A job's business effect (e.g. crediting an account), applied once with the completion that
# accepts ``output``: it writes through a Session on the completion's own transaction, so both
# commit or neither does.
Effect = Callable[[Session, dict[str, Any]], None]


@dataclass(frozen=True)
class CompletedBy:
    """What the completing Attempt tells about itself: the model calls it made, and the Prefect
    flow run and task run it ran in (the Run's output location), when it ran in Prefect."""

    model_calls: int = 0
    flow_run_id: str | None = None
    task_run_id: str | None = None

    def params(self) -> dict[str, Any]:
        return {"model_calls": check_calls(self.model_calls),
                "completed_flow_run_id": self.flow_run_id,
                "completed_task_run_id": self.task_run_id}


UNRECORDED = CompletedBy()  # a completion outside Prefect that counted no model calls


@dataclass(frozen=True)
class Completion:
    """The completed Run and whether this call completed it (False: someone else had)."""

    run: Run
    new: bool


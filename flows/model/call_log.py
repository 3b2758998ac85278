"""The model call log, a test and diagnostic hook: with $RUNLEDGER_MODEL_CALL_LOG set, every
model call appends one JSON line (job, subject, run_id, pid, time) before it is made, so calls
can be counted across worker processes, including calls whose process was killed mid-way."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from flows.model.protocol import Generation, Model
from store import AFTER_MODEL_ANSWER, fault_point


@dataclass(frozen=True)
class CallLog:
    """An append-only file of model calls; one ``write`` per line under O_APPEND keeps lines
    whole when many processes append at once."""

    path: Path

    def record(self, job: str, subject: str, run_id: str) -> None:
        line = json.dumps({
            "job": job, "subject": subject, "run_id": run_id, "pid": os.getpid(),
            "time": datetime.now(UTC).isoformat(),
        }) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


class CallCount:
    """The model calls one Attempt made, across the retries of its transform stage; the ledger
    records them when the Attempt ends (one subject's stages run in one thread at a time)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class LoggedModel:
    """The model a job's transform receives: it counts and records each call for one Run,
    then delegates."""

    def __init__(self, inner: Model, log: CallLog | None, job: str, subject: str,
                 run_id: str, count: CallCount) -> None:
        self.inner = inner
        self.name = inner.name
        self.log = log
        self.job = job
        self.subject = subject
        self.run_id = run_id
        self.count = count

    def generate(self, prompt: str, *, system: str | None = None) -> Generation:
        # Counted before the call: a call that fails or times out is paid for all the same.
        self.count.value += 1
        if self.log is not None:
            self.log.record(self.job, self.subject, self.run_id)
        answer = self.inner.generate(prompt, system=system)
        fault_point(AFTER_MODEL_ANSWER)  # paid for, and nothing of it stored yet
        return answer

    def close(self) -> None:
        """The inner model outlives one Run: the flow run closes it."""

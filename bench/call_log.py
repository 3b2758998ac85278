"""The Prefect-native baseline's model call log: with no ledger to record its calls, every call
appends one JSON line (job, subject, run_id, pid, time) before it is made, so calls can be
counted across processes, killed ones included (runledger's calls are counted from its ledger)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


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

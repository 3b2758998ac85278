"""What one dispatcher pass did, for the CLI, the Prefect artifact and the events."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flows.delivery.policy import Status

SHOWN_PROBLEMS = 50


@dataclass(frozen=True)
class Delivery:
    """One attempt's outcome, as the ledger recorded it."""

    message_id: str
    run_id: str
    recipient: str  # the channel's target
    attempt: int
    status: Status
    delay: float | None = None
    error: str | None = None
    reply_code: int | None = None
    channel: str = "email"


@dataclass
class DeliveryReport:
    """Counts per outcome plus the messages that were not sent. ``released`` holds the messages
    given back untried; ``lost`` counts those whose lease was taken over before the outcome was
    recorded."""

    owner: str
    transport: str
    channel: str = "email"
    deliveries: list[Delivery] = field(default_factory=list)
    released: set[str] = field(default_factory=set)
    lost: int = 0
    stopped: str | None = None
    seconds: float = 0.0

    def add(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        self.released.discard(delivery.message_id)  # given back earlier, tried after all

    @property
    def counts(self) -> dict[str, int]:
        tally = Counter(d.status.value for d in self.deliveries)
        counts = {s.value: tally.get(s.value, 0) for s in Status}
        counts.update(released=len(self.released), lost=self.lost)
        return counts

    @property
    def problems(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.status is not Status.SENT]

    def rows(self) -> list[dict[str, str]]:
        """The not-sent messages as table rows (at most ``SHOWN_PROBLEMS``)."""
        return [
            {
                "message": d.message_id[:12], "recipient": d.recipient, "attempt": str(d.attempt),
                "status": d.status.value,
                "next try in": "-" if d.delay is None else f"{d.delay:.0f} s",
                "error": (d.error or "")[:200],
            }
            for d in self.problems[:SHOWN_PROBLEMS]
        ]

    def markdown(self) -> str:
        counts = self.counts
        lines = [
            f"# Outbox delivery: {self.channel} ({self.transport})",
            "",
            "| outcome | messages |",
            "|---|---:|",
            *[f"| {name} | {n} |" for name, n in counts.items()],
            "",
            f"Dispatcher `{self.owner}`, {self.seconds:.1f} s.",
        ]
        if self.stopped:
            lines += ["", f"**Stopped early:** {self.stopped}"]
        rows = self.rows()
        if rows:
            header = list(rows[0])
            lines += ["", "## Not sent", "", "| " + " | ".join(header) + " |",
                      "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(r[h].replace("|", "\\|") for h in header) + " |"
                      for r in rows]
            if counts["uncertain"]:
                lines += ["", "Uncertain messages may already be at the receiver: "
                              "`runledger outbox list --status uncertain`."]
        return "\n".join(lines)

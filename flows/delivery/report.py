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
    settled: bool = False  # the receiver, asked about an earlier attempt, answered for it


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
        """Messages per outcome, the released and the lost; ``settled``: of the sent, those an
        earlier attempt had delivered, as the receiver said when asked (not sent again)."""
        tally = Counter(d.status.value for d in self.deliveries)
        counts = {s.value: tally.get(s.value, 0) for s in Status}
        counts.update(released=len(self.released), lost=self.lost,
                      settled=sum(d.settled and d.status is Status.SENT
                                  for d in self.deliveries))
        return counts

    def summary(self) -> str:
        """The counts in one line, e.g. "3 sent (1 settled by asking the receiver), 1 retry"."""
        counts = self.counts
        settled = counts.pop("settled")
        shown = [f"{n} {name}" + (f" ({settled} settled by asking the receiver)"
                                   if name == "sent" and settled else "")
                 for name, n in counts.items() if n]
        return ", ".join(shown) or "nothing was due"

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
        settled = counts.pop("settled")
        lines = [
            f"# Outbox delivery: {self.channel} ({self.transport})",
            "",
            "| outcome | messages |",
            "|---|---:|",
            *[f"| {name} | {n} |" for name, n in counts.items()],
            "",
            *([f"{settled} of the sent were settled by asking the receiver about an earlier "
               "attempt: it had them, so they were not sent again.", ""] if settled else []),
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

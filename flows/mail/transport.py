"""What both email transports share: a claim becomes a Letter from the configured sender, and
no email receiver offers a status lookup (an uncertain message follows the policy)."""

from __future__ import annotations

from flows.mail.letter import Letter
from flows.transport import SendOutcome
from store import MessageClaim


class EmailTransport:
    """The email half of the ``Transport`` protocol that SMTP and the HTTP provider share."""

    channel = "email"

    @property
    def sender(self) -> str:
        """The From address (RUNLEDGER_MAIL_FROM)."""
        raise NotImplementedError

    def render(self, claim: MessageClaim) -> Letter:
        return Letter.from_claim(claim, self.sender)

    async def settle(self, item: Letter) -> SendOutcome | None:
        return None

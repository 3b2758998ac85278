"""Mail delivery: the transports (SMTP over aiosmtplib, a Resend-style HTTP provider), their
settings, the rendering of an outbox message into a letter, and an SMTP sink for tests. Exports
the email channel's definition."""

from flows.mail.channel import CHANNEL

__all__ = ["CHANNEL"]

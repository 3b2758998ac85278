"""Errors of the mail transports."""

from __future__ import annotations

from store import RunledgerError


class MailConfigurationError(RunledgerError):
    """The mail transport is misconfigured (settings, authentication or TLS); nothing was sent
    and the claimed messages were given back without counting an attempt."""

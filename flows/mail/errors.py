"""Errors of the mail transports."""

from __future__ import annotations

from flows.errors import DeliveryConfigurationError


class MailConfigurationError(DeliveryConfigurationError):
    """The mail transport is misconfigured (settings, authentication or TLS); nothing was sent
    and the claimed messages were given back without counting an attempt."""

"""A Prefect Block per webhook endpoint: an outbox message's target is the block's name, so the
ledger never stores a URL that may hold a token. The signing secret lives in a Prefect
``Secret`` block named here."""

from __future__ import annotations

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from pydantic import Field, SecretStr, ValidationError

from flows.errors import DeliveryConfigurationError
from flows.webhook.settings import WebhookSettings


class WebhookEndpoint(Block):
    """Where the deliver-outbox flow POSTs a job's webhook messages. HTTPS is required unless the
    host is loopback."""

    _block_type_name = "runledger webhook endpoint"
    _block_type_slug = "runledger-webhook-endpoint"
    _description = "Webhook URL, signing secret and status lookup for runledger's outbox."

    url: str = Field(description="Where the JSON is POSTed (https unless loopback).")
    secret_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the Standard Webhooks "
                                  "secret (whsec_...); empty sends unsigned requests.")
    lookup_url: str | None = Field(
        default=None, description="Status lookup template, e.g. {url}/{key}: 200 delivered, "
                                  "404 never seen.")
    key_retention_hours: float | None = Field(
        default=None, description="How long the receiver remembers an Idempotency-Key.")
    timeout: float = Field(default=30.0, description="Seconds to wait for the answer.")

    async def settings(self, name: str) -> WebhookSettings:
        """This endpoint's settings, validated, with its secret read from its Secret block."""
        secret: SecretStr | None = None
        if self.secret_block:
            try:
                stored: object = await Secret.aload(self.secret_block)
            except ValueError as exc:
                raise DeliveryConfigurationError(
                    f"webhook endpoint {name!r}: its secret block {self.secret_block!r} does not "
                    "exist; create it (prefect block create secret) or clear secret_block"
                ) from exc
            if not isinstance(stored, Secret):
                raise DeliveryConfigurationError(
                    f"webhook endpoint {name!r}: block {self.secret_block!r} is not a Secret block")
            secret = SecretStr(str(stored.get()))
        return endpoint_settings(
            name=name, url=self.url, secret=secret, lookup_url=self.lookup_url,
            key_retention_hours=self.key_retention_hours, timeout=self.timeout)


def endpoint_settings(**values: object) -> WebhookSettings:
    """Validated endpoint settings; a problem is one ``DeliveryConfigurationError`` naming each
    bad field (values are left out: one may be the secret)."""
    try:
        return WebhookSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'endpoint'}: "
            f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise DeliveryConfigurationError(
            f"webhook endpoint {values.get('name')!r} is invalid: {problems}") from None


async def load_endpoint(name: str) -> WebhookSettings:
    """The settings of the WebhookEndpoint block called ``name``; a missing block is a clear
    configuration error."""
    try:
        block: object = await WebhookEndpoint.aload(name)
    except ValueError as exc:
        raise DeliveryConfigurationError(
            f"no webhook endpoint block named {name!r}; create one (a 'runledger webhook "
            "endpoint' block) or fix the message's target"
        ) from exc
    if not isinstance(block, WebhookEndpoint):
        raise DeliveryConfigurationError(f"block {name!r} is not a runledger webhook endpoint")
    return await block.settings(name)

"""Who may use the local stack's Prefect API: nobody but this host, unless basic authentication
is configured.

Whoever reaches a Prefect API can start any deployment (spend model money, send email) and read
every flow run's parameters and logs. `runledger stack up` therefore binds to loopback by
default and refuses any other address unless ``PREFECT_SERVER_API_AUTH_STRING`` is set; the
server then gets that string and every process the stack starts (serve, workers, deploy) gets it
as its client's ``PREFECT_API_AUTH_STRING``. The string is never printed: only its user part."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr

from flows.stack.processes import StackError

SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"
MIN_PASSWORD_CHARS = 12
HOW_TO_CONFIGURE = (
    f'  export {SERVER_AUTH_ENV}="admin:$(openssl rand -hex 16)"\n'
    f'  export {CLIENT_AUTH_ENV}="${SERVER_AUTH_ENV}"\n'
    "(the UI asks for that user and password; every worker, `prefect` and `runledger` command "
    f"that talks to the server needs {CLIENT_AUTH_ENV} set to the same value; see "
    "docs/security.md)"
)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ::1; False for every other name
    or address (0.0.0.0 and :: listen on every interface)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def masked(auth: str) -> str:
    """The auth string as it may be shown: its user part and stars."""
    user = auth.split(":", 1)[0] if ":" in auth else ""
    return f"{user}:****" if user else "****"


@dataclass(frozen=True)
class StackAuth:
    """The Prefect API's basic-auth string ("user:password"), if any, kept secret."""

    secret: SecretStr | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StackAuth:
        """The server's string from ``PREFECT_SERVER_API_AUTH_STRING`` (else the client's
        ``PREFECT_API_AUTH_STRING``); if both are set they must be equal."""
        server = env.get(SERVER_AUTH_ENV) or None
        client = env.get(CLIENT_AUTH_ENV) or None
        if server and client and server != client:
            raise StackError(f"{SERVER_AUTH_ENV} and {CLIENT_AUTH_ENV} differ: the stack's own "
                             f"clients could not use its server; set both to the same value")
        value = server or client
        return cls(SecretStr(value) if value else None)

    @property
    def configured(self) -> bool:
        return self.secret is not None

    @property
    def value(self) -> str | None:
        return self.secret.get_secret_value() if self.secret is not None else None

    @property
    def shown(self) -> str:
        return masked(self.value) if self.value else "none"

    def check(self, host: str, what: str = "the Prefect server") -> None:
        """Refuse to expose ``what`` on a non-loopback ``host`` without authentication, or with
        an auth string that is not "user:password" with a password of 12 characters or more."""
        value = self.value
        if value is not None:
            user, _, password = value.partition(":")
            if not user or not password:
                raise StackError(f'{SERVER_AUTH_ENV} must be "user:password" (the UI asks for '
                                 f"both); set it like this:\n{HOW_TO_CONFIGURE}")
        if is_loopback(host):
            return
        if value is None:
            raise StackError(
                f"refusing to start {what} on {host} without authentication: anyone who can "
                "reach it could run every deployment (spending model money, sending email) and "
                "read every flow run's parameters and logs. Keep the default --host 127.0.0.1, "
                f"or configure basic authentication first:\n{HOW_TO_CONFIGURE}")
        if len(value.partition(":")[2]) < MIN_PASSWORD_CHARS:
            raise StackError(
                f"refusing to start {what} on {host}: the password in {SERVER_AUTH_ENV} is "
                f"shorter than {MIN_PASSWORD_CHARS} characters; make a random one:\n"
                f"{HOW_TO_CONFIGURE}")

    def server_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for the server: its auth string set (or removed when there is none)."""
        out = {k: v for k, v in env.items() if k not in (SERVER_AUTH_ENV, CLIENT_AUTH_ENV)}
        if self.value is not None:
            out[SERVER_AUTH_ENV] = self.value
        return out

    def client_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for a client of the server (serve, workers, their flow runs, deploy): the
        client's auth string set; the server's never passed on."""
        out = {k: v for k, v in env.items() if k not in (SERVER_AUTH_ENV, CLIENT_AUTH_ENV)}
        if self.value is not None:
            out[CLIENT_AUTH_ENV] = self.value
        return out


NO_AUTH = StackAuth()

"""`runledger stack up` and the Prefect API's basic authentication: refused off loopback without
it, passed to the server and every client when set, and never printed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.stack.auth import CLIENT_AUTH_ENV, SERVER_AUTH_ENV, StackAuth, is_loopback, masked
from flows.stack.config import StackConfig, flow_env
from flows.stack.local import LocalStack
from flows.stack.processes import StackError

SECRET = "admin:0123456789abcdef0123456789abcdef"
HOW = 'export PREFECT_SERVER_API_AUTH_STRING="admin:$(openssl rand -hex 16)"'


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("LOCALHOST", True),
    ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False), ("192.168.1.20", False),
    ("10.0.0.1", False), ("prefect.example.org", False), ("localhost.example.org", False),
    ("", False),
])
def test_only_localhost_127_0_0_0_8_and_ipv6_1_count_as_loopback(host: str, loopback: bool) -> None:
    """Every other address or name may be reachable from the network."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "prefect.example.org", "::"])
def test_stack_up_refuses_a_non_loopback_host_without_authentication(
        host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stack up --host` off loopback without PREFECT_SERVER_API_AUTH_STRING exits 1 with the
    reason and how to set the server's and the clients' strings, before creating anything."""
    monkeypatch.delenv(SERVER_AUTH_ENV, raising=False)
    monkeypatch.delenv(CLIENT_AUTH_ENV, raising=False)
    home = tmp_path / "stack"
    result = CliRunner().invoke(app, ["stack", "up", "--home", str(home), "--host", host])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert f"refusing to start the Prefect server on {host} without authentication" in text
    assert HOW in text and 'export PREFECT_API_AUTH_STRING="$PREFECT_SERVER_API_AUTH_STRING"' in text
    assert not home.exists()


@pytest.mark.parametrize(("value", "message"), [
    ("admin:pw7x9", "shorter than 12 characters"),
    ("no-colon-at-all-0123456789", 'must be "user:password"'),
    (":0123456789abcdef", 'must be "user:password"'),
    ("admin:", 'must be "user:password"'),
])
def test_a_weak_or_malformed_auth_string_is_refused_off_loopback(value: str, message: str) -> None:
    """The password part must be there and at least 12 characters; the error never shows it."""
    with pytest.raises(StackError, match=message) as caught:
        StackAuth.from_env({SERVER_AUTH_ENV: value}).check("0.0.0.0")
    password = value.partition(":")[2]
    assert not password or password not in str(caught.value)


def test_different_server_and_client_strings_are_refused() -> None:
    """The stack's own clients would be refused by its server."""
    with pytest.raises(StackError, match="differ"):
        StackAuth.from_env({SERVER_AUTH_ENV: SECRET, CLIENT_AUTH_ENV: "admin:another-one-123"})


def test_an_auth_string_allows_any_host_and_reaches_the_server_and_every_client(
        tmp_path: Path) -> None:
    """With the string set, 0.0.0.0 is accepted; the server gets it as
    PREFECT_SERVER_API_AUTH_STRING, serve/workers/deploy as PREFECT_API_AUTH_STRING only."""
    auth = StackAuth.from_env({SERVER_AUTH_ENV: SECRET})
    auth.check("0.0.0.0")
    assert StackAuth.from_env({CLIENT_AUTH_ENV: SECRET}).value == SECRET
    base = {"PATH": "/bin", SERVER_AUTH_ENV: "stale", CLIENT_AUTH_ENV: "stale"}
    assert auth.server_env(base) == {"PATH": "/bin", SERVER_AUTH_ENV: SECRET}
    env = flow_env(base, StackConfig(home=tmp_path, host="0.0.0.0", auth=auth),
                   "sqlite:////tmp/l.db", 2525)
    assert env[CLIENT_AUTH_ENV] == SECRET and SERVER_AUTH_ENV not in env
    unauthenticated = flow_env(base, StackConfig(home=tmp_path), "sqlite:////tmp/l.db", 2525)
    assert CLIENT_AUTH_ENV not in unauthenticated and SERVER_AUTH_ENV not in unauthenticated


def test_the_auth_string_is_masked_in_the_banner_and_in_reprs(tmp_path: Path) -> None:
    """The banner names the user and where clients set the string, never the password; the
    config's repr does not carry it either."""
    auth = StackAuth.from_env({SERVER_AUTH_ENV: SECRET})
    config = StackConfig(home=tmp_path, host="0.0.0.0", auth=auth)
    banner = LocalStack(config).banner()
    password = SECRET.partition(":")[2]
    assert "admin:****" in banner and "PREFECT_API_AUTH_STRING" in banner
    assert "plain HTTP" in banner
    for shown in (banner, repr(config), repr(auth), str(auth), auth.shown):
        assert password not in shown
    assert masked("nocolon") == "****"
    loopback = LocalStack(StackConfig(home=tmp_path / "b")).banner()
    assert "API auth     none (loopback only" in loopback

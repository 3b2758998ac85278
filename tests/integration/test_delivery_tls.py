"""TLS over loopback with a throwaway CA: STARTTLS and implicit TLS deliver when the server's
certificate verifies; an untrusted certificate or a TLS mismatch stops the run."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from flows.mail.errors import MailConfigurationError
from flows.mail.settings import TlsMode
from flows.mail.sink import Sink
from store import Ledger
from tests.support.delivery import deliver, queue, statuses


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    """A CA file for the client and a server context whose certificate names 127.0.0.1."""
    folder = tmp_path_factory.mktemp("tls")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(_name("runledger test CA"))
        .issuer_name(_name("runledger test CA")).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    return ca_file, server


def test_starttls_with_a_verified_certificate_delivers(ledger: Ledger,
                                                       certificates: tuple[Path, ssl.SSLContext]) -> None:
    """RUNLEDGER_SMTP_TLS=starttls upgrades the session, verifies the certificate and sends."""
    ca_file, server = certificates
    queue(ledger, 2)
    with Sink(starttls=server) as sink:
        report = deliver(ledger, sink, tls=TlsMode.STARTTLS, ca_file=ca_file)
        assert report.counts["sent"] == 2 and sink.stats["received"] == 2


def test_implicit_tls_with_a_verified_certificate_delivers(ledger: Ledger,
                                                           certificates: tuple[Path, ssl.SSLContext]) -> None:
    """RUNLEDGER_SMTP_TLS=tls connects over TLS from the first byte."""
    ca_file, server = certificates
    queue(ledger, 1)
    with Sink(implicit_tls=server) as sink:
        assert deliver(ledger, sink, tls=TlsMode.TLS, ca_file=ca_file).counts["sent"] == 1


def test_an_untrusted_certificate_stops_the_run(ledger: Ledger,
                                                certificates: tuple[Path, ssl.SSLContext]) -> None:
    """Without the CA the certificate does not verify: a configuration error, nothing counted."""
    _, server = certificates
    queue(ledger, 2)
    with Sink(starttls=server) as sink, \
            pytest.raises(MailConfigurationError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
        deliver(ledger, sink, tls=TlsMode.STARTTLS)
    assert statuses(ledger) == {"pending": 2}


def test_implicit_tls_against_a_plaintext_server_stops_the_run(ledger: Ledger) -> None:
    """tls against a server that speaks plaintext SMTP is a configuration error, not a retry."""
    queue(ledger, 1)
    with Sink() as sink, pytest.raises(MailConfigurationError, match=r"TLS with 127\.0\.0\.1"):
        deliver(ledger, sink, tls=TlsMode.TLS)
    assert statuses(ledger) == {"pending": 1}

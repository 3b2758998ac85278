"""The mail host: the SMTP sink (flows/mail/sink.py) on the cluster's mail address, with STARTTLS
under a certificate for that address from a CA of the run's own. runledger sends without TLS
only to a loopback host (RUNLEDGER_SMTP_TLS=none is refused for any other), so a sink on
another host needs TLS, as a real relay would.

    python -m tests.hosts.mail_host ADDRESS PORT MAILDIR TLS_FOLDER [FAULT ...]"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import sys
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from flows.mail.sink import Fault, Sink

# Wide validity: a worker whose clock is skewed by minutes must still trust it.
VALID = dt.timedelta(days=2)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certificates(folder: Path, address: str) -> Path:
    """A CA (``ca.pem``, for the clients) and a server certificate for ``address``
    (``server.pem``, ``server.key``); returns the CA file."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("runledger hosts CA"))
          .issuer_name(_name("runledger hosts CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - VALID).not_valid_after(now + VALID)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(_name(address)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - VALID).not_valid_after(now + VALID)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return folder / "ca.pem"


def main(address: str, port: int, maildir: str, tls: str, *faults: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(Path(tls) / "server.pem", Path(tls) / "server.key")
    Path(maildir).mkdir(parents=True, exist_ok=True)
    with Sink(host=address, port=port, maildir=Path(maildir), starttls=context,
              faults=[Fault.parse(f) for f in faults]):
        print(f"mail host listening on {address}:{port}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[5:])

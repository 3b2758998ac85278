"""Write a self-signed TLS certificate and key for the compose stack's SMTP sink (Mailpit).

runledger requires TLS for any SMTP host that is not loopback, with the certificate verified:
the workers trust this certificate through RUNLEDGER_SMTP_CA_FILE.

    python infra/make_certs.py DIR HOST [HOST ...]   ->  DIR/<first host>.crt and .key
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 825


def make_certificate(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """A self-signed certificate for ``hosts`` (it is its own CA); existing files are kept."""
    cert_path = directory / f"{hosts[0]}.crt"
    key_path = directory / f"{hosts[0]}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    # Mailpit runs as another user than this container: it must be able to read the key.
    key_path.chmod(0o644)
    return cert_path, key_path


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for path in make_certificate(Path(sys.argv[1]), sys.argv[2:]):
        print(path)

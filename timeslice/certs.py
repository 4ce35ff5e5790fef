"""A CA and a server certificate for the orchestrator's TLS, for clusters without a certificate
manager, the demo and the tests (``rose timeslice certs``).

I/O boundary: writes ``ca.crt``, ``tls.crt`` and ``tls.key`` (PEM, 0600 for the key) into a folder.
In a cluster, put ``tls.crt``/``tls.key`` in the Secret ``rose-timeslice-tls`` (``kubectl create
secret tls``) and give the callers ``ca.crt`` (``ROSE_TIMESLICE_CA_FILE``); a certificate from your
own CA or cert-manager works the same way.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = (
    "localhost",
    "127.0.0.1",
    "rose-timeslice",
    "rose-timeslice.rose-system",
    "rose-timeslice.rose-system.svc",
    "rose-timeslice.rose-system.svc.cluster.local",
)


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def generate(folder: Path, hosts: tuple[str, ...] = DEFAULT_HOSTS, days: int = 365) -> CertFiles:
    """A fresh CA and a server certificate for ``hosts`` (DNS names or IPs) signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rose-timeslice-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out = CertFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.touch(mode=0o600)
    out.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return out

"""The local cluster's PKI: one CA, serving and client certificates, the service-account keys.

Everything is generated with ``cryptography`` (no openssl shell-outs) and written 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rose_common.atomic import atomic_write

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of every PEM file the control plane needs."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, data, mode=0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def generate(pki_dir: Path) -> Pki:
    """Create a fresh PKI in ``pki_dir`` (idempotent: existing complete PKI is kept)."""
    pki = Pki(pki_dir)
    pki_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    wanted = [pki.ca_crt, pki.sa_key, pki.sa_pub] + [
        pki.crt(n) for n in ("apiserver", "admin", "controller-manager", "scheduler", "etcd")
    ]
    if all(p.exists() for p in wanted):
        return pki
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _ca_cert(ca_key, now)
    _write(pki.ca_key, _key_pem(ca_key))
    _write(pki.ca_crt, ca.public_bytes(serialization.Encoding.PEM))

    def leaf(name: str, cn: str, org: str | None, server: bool, client: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_cert(key, ca_key, ca.subject, now, _name(cn, org), server=server, client=client)
        _write(pki.key(name), _key_pem(key))
        _write(pki.crt(name), cert.public_bytes(serialization.Encoding.PEM))

    leaf("apiserver", "kube-apiserver", None, server=True, client=False)
    leaf("etcd", "etcd", None, server=True, client=True)
    leaf("admin", "rose-admin", "system:masters", server=False, client=True)
    leaf("controller-manager", "system:kube-controller-manager", None, server=False, client=True)
    leaf("scheduler", "system:kube-scheduler", None, server=False, client=True)

    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(pki.sa_key, _key_pem(sa))
    _write(
        pki.sa_pub,
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return pki


def _ca_cert(ca_key: ec.EllipticCurvePrivateKey, now: dt.datetime) -> x509.Certificate:
    """The self-signed local CA, valid from ``now``."""
    ca_name = _name("rose-local-ca")
    return (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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


def _leaf_cert(
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    now: dt.datetime,
    subject: x509.Name,
    *,
    server: bool,
    client: bool,
) -> x509.Certificate:
    """A certificate for ``key`` signed by the CA: server (the API server's names and IPs) and/or client."""
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.DNSName("kubernetes.default.svc.cluster.local"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
                ]
            ),
            critical=False,
        )
    return b.sign(ca_key, hashes.SHA256())

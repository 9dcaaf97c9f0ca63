"""Certificates, made one way: a CA, and certificates it signs for servers (their DNS names and
IP addresses) or clients (a name and an organization, as Kubernetes reads a user and its
group). The operator's admission webhook and the development harness's control plane both
issue theirs here. ECDSA P-256 keys, PEM encoded; needs `cryptography` (the operator's
extra, not the device plugin's).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_BACKDATED = datetime.timedelta(minutes=5)
"""Valid from a little before now: a peer whose clock runs behind still accepts it."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, PEM encoded."""

    cert: bytes
    key: bytes


def new_ca(common_name: str, *, valid: datetime.timedelta) -> Issued:
    """A self-signed CA that may sign certificates (not other CAs' certificates)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(name, name, key.public_key(), valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), private_pem(key))


def issue(
    ca: Issued,
    common_name: str,
    *,
    valid: datetime.timedelta,
    hosts: Iterable[str] = (),
    organization: str | None = None,
) -> Issued:
    """A certificate signed by `ca`: for a server answering at `hosts` (DNS names or IP
    addresses) when given, else for a client named `common_name` of `organization`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA's key is not an ECDSA key made by gpushare.certs")
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = _builder(
        x509.Name(attributes), ca_cert.subject, key.public_key(), valid
    ).add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    names = [_general_name(host) for host in sorted(set(hosts))]
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(names), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), private_pem(key))


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    valid: datetime.timedelta,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATED)
        .not_valid_after(now + valid)
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)

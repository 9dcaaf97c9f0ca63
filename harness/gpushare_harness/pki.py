"""The certificates a TLS-and-RBAC control plane needs, written like envtest writes them:
one CA that signs the serving certificate and the admin client certificate
(O=system:masters), and the service-account signing key pair. The CA's key is kept beside
them so that real nodes get certificates of their own later (`issue`): the kubelet's client
certificate (system:node:<name>), its serving certificate, and the apiserver's client
certificate for the kubelet."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True, kw_only=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    kubelet_client_cert: Path
    """The apiserver's client certificate towards kubelets (exec, logs)."""
    kubelet_client_key: Path
    sa_public: Path
    sa_private: Path

    def issue(
        self,
        stem: Path,
        common_name: str,
        *,
        organization: str | None = None,
        server_ips: Sequence[str] = (),
        server_names: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """A certificate signed by the cluster CA at `stem`.crt/.key: a server certificate
        for `server_ips`/`server_names` when given, else a client certificate."""
        ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        cert, key = _leaf(ca.subject, ca_key, common_name, organization, server_ips, server_names)
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert)
        _write_secret(key_path, key)
        return cert_path, key_path


def write_pki(directory: Path, *, server_ips: Sequence[str] = ("127.0.0.1",)) -> Pki:
    """Create the CA, serving (for `server_ips`), admin and service-account keys under
    `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpushare-local-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
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
    sa_key = ec.generate_private_key(ec.SECP256R1())
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
        sa_public=directory / "sa.pub",
        sa_private=directory / "sa.key",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_secret(pki.ca_key, _private_pem(ca_key))
    pki.issue(
        pki.serving_cert,
        "kube-apiserver",
        server_ips=server_ips,
        server_names=("localhost", "kubernetes", "kubernetes.default"),
    )
    pki.issue(pki.admin_cert, "gpushare-admin", organization="system:masters")
    # The kubelet authorizes exec and logs through a SubjectAccessReview of this user.
    pki.issue(
        pki.kubelet_client_cert, "kube-apiserver-kubelet-client", organization="system:masters"
    )
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_secret(pki.sa_private, _private_pem(sa_key))
    return pki


def _leaf(  # noqa: PLR0917 - one private helper, called twice
    issuer: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    organization: str | None,
    server_ips: Sequence[str],
    server_names: Sequence[str],
) -> tuple[bytes, bytes]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server_ips or server_names:
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in server_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(
            x509.SubjectAlternativeName(names), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _private_pem(key)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_secret(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)

"""The certificates a TLS-and-RBAC control plane needs, written like envtest writes them:
one CA that signs the serving certificate and the admin client certificate
(O=system:masters), and the service-account signing key pair. The CA's key is kept beside
them so that real nodes get certificates of their own later (`issue`): the kubelet's client
certificate (system:node:<name>), its serving certificate, and the apiserver's client
certificate for the kubelet."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare import certs

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
        ca = certs.Issued(self.ca_cert.read_bytes(), self.ca_key.read_bytes())
        issued = certs.issue(
            ca,
            common_name,
            organization=organization,
            hosts=[*server_names, *server_ips],
            valid=_VALIDITY,
        )
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(issued.cert)
        _write_secret(key_path, issued.key)
        return cert_path, key_path


def write_pki(directory: Path, *, server_ips: Sequence[str] = ("127.0.0.1",)) -> Pki:
    """Create the CA, serving (for `server_ips`), admin and service-account keys under
    `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.new_ca("gpushare-local-ca", valid=_VALIDITY)
    sa_key = certs.new_key()
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
    pki.ca_cert.write_bytes(ca.cert)
    _write_secret(pki.ca_key, ca.key)
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
    pki.sa_public.write_bytes(certs.public_pem(sa_key))
    _write_secret(pki.sa_private, certs.private_pem(sa_key))
    return pki


def _write_secret(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)

"""The admission webhook's certificate: one Secret shared by every replica, made for the names
the apiserver calls it by; or another issuer's (cert-manager's), mounted."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509

from gpushare.kube import ApiError
from gpushare_operator.config import OperatorConfig, load
from gpushare_operator.kubeapi import KubeSchedulerApi
from gpushare_operator.webhook import (
    CA_KEY,
    CERT_KEY,
    KEY_KEY,
    CertificateMissing,
    issue,
    mounted_serving_files,
    shared_certificate,
)


def test_the_serving_certificate_names_each_host_and_is_signed_by_the_ca() -> None:
    bundle = issue({"gpushare-webhook.gpushare-system.svc", "127.0.0.1"})
    ca = x509.load_pem_x509_certificate(bundle[CA_KEY])
    cert = x509.load_pem_x509_certificate(bundle[CERT_KEY])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gpushare-webhook.gpushare-system.svc"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


class SecretStore:
    """The Secret calls of the API, in memory; `first_create_conflicts` plays another replica
    that made the Secret between this one's read and create."""

    def __init__(self, first_create_conflicts: bool = False) -> None:
        self.secret: dict[str, Any] | None = None
        self.creates = 0
        self.deletes = 0
        self.conflict = first_create_conflicts

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secret

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        self.creates += 1
        if self.conflict:
            self.conflict = False
            other = issue({"gpushare-webhook.gpushare-system.svc"})
            self.secret = {
                "metadata": {**body["metadata"], "uid": "theirs"},
                "data": {k: base64.b64encode(v).decode() for k, v in other.items()},
            }
            raise ApiError(409, "already exists")
        self.secret = {**body, "metadata": {**body["metadata"], "uid": f"u{self.creates}"}}

    async def delete_secret(self, namespace: str, name: str, uid: str | None) -> None:
        self.deletes += 1
        self.secret = None


def certificate(store: SecretStore, config: OperatorConfig) -> dict[str, bytes]:
    return asyncio.run(shared_certificate(cast(KubeSchedulerApi, store), config))


def test_replicas_share_the_first_certificate_made() -> None:
    store = SecretStore()
    config = OperatorConfig()
    first = certificate(store, config)
    assert certificate(store, config) == first
    assert store.creates == 1


def test_a_replica_that_loses_the_race_uses_the_winners_certificate() -> None:
    store = SecretStore(first_create_conflicts=True)
    mine = certificate(store, OperatorConfig())
    assert store.secret is not None
    assert mine[CA_KEY] == base64.b64decode(store.secret["data"][CA_KEY])


@pytest.mark.parametrize("hosts", [frozenset({"gpushare-webhook.other.svc"})])
def test_a_secret_made_for_other_names_is_replaced(hosts: frozenset[str]) -> None:
    store = SecretStore()
    certificate(store, OperatorConfig())
    moved = certificate(store, replace(OperatorConfig(), webhook_hosts=hosts))
    cert = x509.load_pem_x509_certificate(moved[CERT_KEY])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gpushare-webhook.other.svc"]
    assert store.deletes == 1


def test_a_mounted_certificate_is_served_where_it_lies_with_its_ca(tmp_path: Path) -> None:
    bundle = issue({"gpushare-webhook.gpushare-system.svc"})
    for key, value in bundle.items():
        (tmp_path / key).write_bytes(value)
    config = load({}, {"GPUSHARE_WEBHOOK_CERT_DIR": str(tmp_path)})
    files = mounted_serving_files(Path(config.webhook_cert_dir))
    assert (files.certfile, files.keyfile) == (tmp_path / CERT_KEY, tmp_path / KEY_KEY)
    assert files.ca_pem == bundle[CA_KEY]
    (tmp_path / CA_KEY).unlink()  # an issuer that writes no ca.crt: still served
    assert mounted_serving_files(tmp_path).ca_pem == b""


def test_a_mounted_certificate_folder_without_the_key_names_the_file_and_the_fix(
    tmp_path: Path,
) -> None:
    (tmp_path / CERT_KEY).write_bytes(issue({"h"})[CERT_KEY])
    with pytest.raises(CertificateMissing, match=r"has no tls\.key: mount the issuer's Secret"):
        mounted_serving_files(tmp_path)


def test_without_a_certificate_folder_the_operator_makes_its_own() -> None:
    assert OperatorConfig().webhook_cert_dir == ""
    assert load({}, {"GPUSHARE_WEBHOOK_CERT_DIR": " "}).webhook_cert_dir == ""

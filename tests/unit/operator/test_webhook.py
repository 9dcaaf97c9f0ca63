"""The admission webhook's certificate: one Secret shared by every replica, made for the names
the apiserver calls it by."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from dataclasses import replace
from typing import Any, cast

import pytest
from cryptography import x509

from gpushare.kube import ApiError
from gpushare_operator.config import OperatorConfig
from gpushare_operator.kubeapi import KubeSchedulerApi
from gpushare_operator.webhook import CA_KEY, CERT_KEY, issue, shared_certificate


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

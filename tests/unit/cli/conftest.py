"""The CLI's unit tests talk to a scripted apiserver (`scripted.Apiserver`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from scripted import Apiserver

from gpushare_cli import act, read
from gpushare_cli.kubeconfig import Source


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> Apiserver:
    """The cluster `read.read_cluster` and `act.apply_moves` talk to."""
    server = Apiserver()

    async def connect(source: Source) -> client.ApiClient:
        api = client.ApiClient(client.Configuration(host="https://apiserver.test"))
        api.rest_client.request = server.request  # type: ignore[method-assign,assignment]
        return api

    for module in (read, act):  # the CLI's reads and its one writer
        monkeypatch.setattr(module, "connect", connect)
    monkeypatch.delenv("GPUSHARE_LEASE_NAMESPACE", raising=False)
    return server


@pytest.fixture
def source(tmp_path: Path) -> Source:
    """A kubeconfig whose context is in namespace team-a, as a tenant's is."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://apiserver.test"}}],
                "users": [{"name": "dev", "user": {"token": "t"}}],
                "contexts": [
                    {
                        "name": "dev",
                        "context": {"cluster": "c", "user": "dev", "namespace": "team-a"},
                    }
                ],
                "current-context": "dev",
            }
        )
    )
    return Source(files=(kubeconfig,))

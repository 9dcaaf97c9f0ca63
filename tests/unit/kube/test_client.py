"""The API client: no per-request look into the environment unless a proxy is set there."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.kube import api_client

pytestmark = pytest.mark.asyncio

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in ("https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(variable.upper(), raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


async def test_without_a_proxy_in_the_environment_requests_do_not_look_there(
    kubeconfig: Path,
) -> None:
    async with await api_client(kubeconfig) as api:
        assert api.rest_client.pool_manager.trust_env is False
        assert api.configuration.host == "https://127.0.0.1:6443"


async def test_a_proxy_in_the_environment_is_still_used(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    async with await api_client(kubeconfig) as api:
        assert api.rest_client.pool_manager.trust_env is True

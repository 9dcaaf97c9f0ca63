"""The admission tests' operators (serving the webhook on one loopback port, as replicas
behind one Service) and the admission objects pointing at them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from cluster import refused_rights
from kubernetes_asyncio import client

from gpushare_harness.controlplane import free_port
from gpushare_harness.crds import install_admission
from gpushare_harness.operator import OperatorProcess, webhook_url


@pytest.fixture
def webhook_port() -> int:
    return free_port()


@pytest.fixture
def operators(
    operator_kubeconfig: Path, tmp_path: Path, webhook_port: int
) -> Iterator[Callable[..., OperatorProcess]]:
    """Operator replicas on the operator's own token (`operator_kubeconfig`)."""
    started: list[OperatorProcess] = []

    def start(identity: str = "op-1", **env: str) -> OperatorProcess:
        process = OperatorProcess(
            operator_kubeconfig,
            tmp_path / f"{identity}.log",
            identity=identity,
            env=env,
            webhook_port=webhook_port,
        )
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()
    refused_rights(started)


@pytest_asyncio.fixture
async def admission(api: client.ApiClient, webhook_port: int) -> None:
    await install_admission(api, webhook_url(webhook_port))

"""Each operator test gets a control plane of its own (about 4 s), so what one test's
operator schedules can never land on another test's nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from gpushare import kube
from gpushare_harness import ControlPlane
from gpushare_harness.crds import install_crds
from gpushare_harness.operator import OperatorProcess


@pytest.fixture
def plane(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    own = ControlPlane(tmp_path / "plane", binaries=control_plane.binaries)
    with own:
        yield own


@pytest_asyncio.fixture
async def api(plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    async with await kube.api_client(plane.kubeconfig) as api_client:
        await install_crds(api_client)
        await client.CoreV1Api(api_client).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name="gpushare-system"))
        )
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def start_operator(plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(identity: str = "op-1", *, wait_synced: bool = True, **env: str) -> OperatorProcess:
        process = OperatorProcess(
            plane.kubeconfig, tmp_path / f"{identity}.log", identity=identity, env=env
        )
        started.append(process)
        return process.start(wait_synced=wait_synced)

    yield start
    for process in started:
        process.stop()

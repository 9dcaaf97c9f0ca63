"""A real etcd + kube-apiserver for the session; a client and a namespace per test.

The binaries are built on first use (harness/go). Where they cannot be built, the tests
skip with the reason locally, and fail in CI (CI=true), where nothing may be skipped.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from gpushare import kube
from gpushare_harness import ControlPlane, ensure_binaries
from gpushare_harness.binaries import BuildError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        binaries = ensure_binaries()
    except BuildError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no local control plane: {error}")
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), binaries=binaries)
    with plane:
        yield plane


@pytest.fixture
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest_asyncio.fixture
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    async with await kube.api_client(kubeconfig) as api:
        yield api
    # A test must not leave tasks running behind it.
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not leftover, f"tasks left running: {leftover}"


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest_asyncio.fixture
async def namespace(core: client.CoreV1Api) -> str:
    """A fresh namespace per test (never deleted: without a controller-manager namespaces
    would hang in Terminating)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def unique() -> str:
    """A suffix that keeps cluster-scoped names (nodes) apart between tests."""
    return uuid.uuid4().hex[:8]

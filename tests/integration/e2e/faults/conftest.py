"""The campaigns' pods are created and deleted by a tenant, as users do it: a ServiceAccount
bound to the built-in role `edit` in the namespace. Their control plane therefore runs
kube-controller-manager, which fills that aggregated role; it never marks the harness's nodes
NotReady within a campaign."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from gpushare import kube
from gpushare_harness import ControlPlane
from gpushare_harness.identities import tenant_kubeconfig


@pytest.fixture
def plane(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    own = ControlPlane(
        tmp_path / "plane",
        binaries=control_plane.binaries,
        controllers=True,
        node_monitor_grace_s=3600,
    )
    with own:
        yield own


@pytest_asyncio.fixture
async def tenant(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> AsyncIterator[client.CoreV1Api]:
    config = await tenant_kubeconfig(core, plane.kubeconfig, "default", tmp_path / "tenant")
    async with await kube.api_client(config) as api:
        yield client.CoreV1Api(api)

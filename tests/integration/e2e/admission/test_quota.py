"""A ResourceQuota on volcano.sh/gpu-memory, with the controller-manager computing its
usage: it counts devices (units of the cluster's memory unit), since the webhook converts
limits before the quota is checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admitting import create, ready, refusal
from cluster import eventually, gpu_pod
from kubernetes_asyncio import client

from gpushare.model import contract
from gpushare_harness import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def plane(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    own = ControlPlane(tmp_path / "plane", binaries=control_plane.binaries, controllers=True)
    with own:
        yield own


async def test_a_quota_on_gpu_memory_counts_devices(
    core: client.CoreV1Api, operators: Any, admission: None
) -> None:
    operators()
    await ready(core)
    await core.create_namespaced_resource_quota(
        "default",
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="gpu"),
            spec=client.V1ResourceQuotaSpec(hard={f"requests.{contract.GPU_MEMORY}": "4"}),
        ),
    )

    async def counted() -> bool:
        quota = await core.read_namespaced_resource_quota("gpu", "default")
        return bool(quota.status and quota.status.hard)

    await eventually(counted, timeout_s=20, what="the quota's status")
    for name in ("q1", "q2"):  # 1024 MiB = 2 devices each: 4 in all
        await create(core, gpu_pod(name, 1024, nodeSelector={"none": "none"}))
    message = await refusal(core, gpu_pod("q3", 1024, nodeSelector={"none": "none"}))
    assert "exceeded quota" in message

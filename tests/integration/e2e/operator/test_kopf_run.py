"""The README's way to run the operator during development: `kopf run` on the handlers."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from cluster import bound, create_pod, gpu_index, gpu_pod
from kubernetes_asyncio import client

from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.controlplane import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_kopf_run_schedules_the_guides_pod(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="gpu-node-1", gpu_memory=89424, gpu_number=8))
    kopf = Path(sys.executable).parent / "kopf"
    env = {
        **os.environ,
        "KUBECONFIG": str(plane.kubeconfig),
        "GPUSHARE_METRICS_PORT": "0",
        "GPUSHARE_WEBHOOK_PORT": str(free_port()),  # on 127.0.0.1, the default address
    }
    with (tmp_path / "kopf.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            str(kopf),
            "run",
            "--standalone",
            "-A",
            "-m",
            "gpushare_operator.handlers",
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        await create_pod(core, gpu_pod("gpu-pod1", 1024))
        pod = await bound(core, "gpu-pod1", timeout_s=60)
        assert pod["spec"]["nodeName"] == "gpu-node-1"
        assert gpu_index(pod) == "0"
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=30)

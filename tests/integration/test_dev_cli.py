"""`gpushare-dev up/status/env/add-node/down`: the local cluster a person starts by hand."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cluster import dev
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import node_inventory
from gpushare_harness import ControlPlane

pytestmark = pytest.mark.integration


async def read_node(kubeconfig: Path, name: str) -> dict[str, Any]:
    async with await kube.api_client(kubeconfig) as api:
        return await kube.raw_json(client.CoreV1Api(api).read_node(name, _preload_content=False))


def test_up_add_node_status_and_down(tmp_path: Path, control_plane: ControlPlane) -> None:
    # Asking for control_plane makes sure the binaries exist (or the test skips) first.
    directory = tmp_path / "cluster"
    up = dev("up", "--dir", str(directory))
    assert up.returncode == 0, up.stderr
    kubeconfig = directory / "kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in up.stdout
    try:
        assert "already running" in dev("up", "--dir", str(directory)).stdout

        def add_node() -> subprocess.CompletedProcess[str]:
            return dev(
                "add-node",
                "gpu-node-1",
                "--gpu-memory",
                "89424",
                "--gpu-number",
                "8",
                "--dir",
                str(directory),
            )

        added = add_node()
        assert added.returncode == 0, added.stderr
        twice = add_node()
        assert twice.returncode == 0
        assert "already exists" in twice.stdout
        inventory = node_inventory(asyncio.run(read_node(kubeconfig, "gpu-node-1")))
        assert inventory is not None
        assert [c.memory for c in inventory.cards] == [11178] * 8
        assert dev("status", "--dir", str(directory)).returncode == 0
        env = dev("env", "--dir", str(directory))
        assert env.returncode == 0, env.stderr
        exported = subprocess.run(
            ["bash", "-c", f"{env.stdout}\nkubectl get node gpu-node-1 -o name; which gpushare"],
            capture_output=True,
            text=True,
            check=False,
            # A HOME of its own: kubectl keeps its discovery cache there (without one, in the
            # working directory: the checkout).
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        assert exported.stdout.splitlines()[0] == "node/gpu-node-1", exported.stderr
        assert exported.stdout.splitlines()[1].endswith("/gpushare")
    finally:
        down = dev("down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not directory.exists()
    status = dev("status", "--dir", str(directory))
    assert status.returncode == 1
    assert "not running" in status.stdout
    assert "no cluster is running" in dev("env", "--dir", str(directory)).stderr


def test_add_node_without_a_cluster_says_how_to_start_one(tmp_path: Path) -> None:
    result = dev(
        "add-node", "n", "--gpu-memory", "1", "--gpu-number", "1", "--dir", str(tmp_path / "none")
    )
    assert result.returncode == 1
    assert "run gpushare-dev up" in result.stderr

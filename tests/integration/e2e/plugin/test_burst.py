"""Bursts on the demo's two nodes, each the kubelet's device manager with the device plugin at
the default unit: pods created at once are packed as the model packs them one by one, every
container gets the card its annotation names, and a pod that only waited is never reported."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio
from cluster import create_pod, gpu_pod, list_pods, reasons_once_scheduled
from kubernetes_asyncio import client

from gpushare.model import contract
from gpushare_harness.burst import BurstWatch, inventories, live_packing, model_packing

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

UNIT = contract.DEFAULT_MEMORY_UNIT_MIB


async def burst(
    api: client.ApiClient, core: client.CoreV1Api, units: list[int], nodes: list[Any]
) -> None:
    """Creates one pod per entry of `units` at once; asserts what a user would check."""
    seen = BurstWatch("default", len(units))
    ready = asyncio.Event()
    watcher = asyncio.create_task(seen.run(api, ready))
    await ready.wait()
    names = [f"burst-{i:02d}" for i in range(len(units))]
    await asyncio.gather(
        *(create_pod(core, gpu_pod(n, amount)) for n, amount in zip(names, units, strict=True))
    )
    try:
        await asyncio.wait_for(seen.all_assigned.wait(), timeout=60)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    pods = [p for p in await list_pods(core) if p["metadata"]["name"] in names]
    cluster = await inventories(api)
    live = live_packing(cluster, pods)
    model = model_packing(cluster, seen.ordered(pods))
    assert live.no_worse_than(model), f"live {live} against the model {model}"
    sizes: dict[tuple[str, int], int] = {
        (i.node, c.index): c.memory * i.unit_mib for i in cluster for c in i.cards
    }
    assert all(used <= sizes[card] for card, used in live.used.items())
    started = {
        line["pod"]: line
        for node in nodes
        for line in node.kubelet.log_events()
        if line.get("event") == "started"
    }
    for pod in pods:
        name = pod["metadata"]["name"]
        env = started[f"default/{name}"]["envs"]
        assert (
            env[contract.ENV_VISIBLE_DEVICES] == pod["metadata"]["annotations"][contract.GPU_INDEX]
        )
        assert await reasons_once_scheduled(core, name) == ["Scheduled"], name
    assert not seen.reported


@pytest_asyncio.fixture
async def demo_nodes(gpu_node: Callable[..., Any], start_operator: Callable[..., Any]) -> list[Any]:
    """The demo's two nodes at the default unit, and the operator."""
    nodes = [
        await gpu_node("gpu-node-1", "8x11178", unit_mib=None),
        await gpu_node("gpu-node-2", "1x81920,1x40960,2x24576", unit_mib=None),
    ]
    start_operator()
    return nodes


async def test_a_burst_of_same_size_pods_is_packed_as_the_model_packs_it_one_by_one(
    api: client.ApiClient, core: client.CoreV1Api, demo_nodes: list[Any]
) -> None:
    await burst(api, core, [2048 // UNIT] * 40, demo_nodes)


async def test_a_burst_of_mixed_sizes_is_packed_no_worse_than_the_model(
    api: client.ApiClient, core: client.CoreV1Api, demo_nodes: list[Any]
) -> None:
    rng = random.Random(7)
    await burst(api, core, [rng.choice((1, 2, 4, 8, 16)) for _ in range(40)], demo_nodes)

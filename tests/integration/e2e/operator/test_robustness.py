"""Crashes, failover and bad input: nothing is lost, nothing is double-booked."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from cluster import bound, create_pod, events_of, eventually, gpu_index, gpu_pod, list_pods
from cluster import unschedulable as unschedulable_message
from kubernetes_asyncio import client

from gpushare.model import contract, parse_quantity
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]
CARD_MIB = 11178


def is_unschedulable(pod: dict[str, Any]) -> bool:
    """Unschedulable for good: not merely held back behind a same-size pod that the device
    plugin has yet to assign (that wait ends by itself)."""
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and "held back until" not in c.get("message", "")
        for c in pod.get("status", {}).get("conditions", [])
    )


def assert_no_card_over_capacity(pods: list[dict[str, Any]], cards_per_node: int) -> None:
    used: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[tuple[str, int], int] = defaultdict(int)
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        index = gpu_index(pod)
        assert index is not None, f"{pod['metadata']['name']} bound without gpu-index"
        cards = [int(i) for i in index.split(",")]
        assert all(0 <= c < cards_per_node for c in cards)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        for card in cards:
            if contract.GPU_MEMORY in limits:
                used[node, card] += parse_quantity(
                    limits[contract.GPU_MEMORY], resource=contract.GPU_MEMORY, owner="test"
                )
            else:
                whole[node, card] += 1
    for key, mib in used.items():
        assert mib <= CARD_MIB, f"card {key} holds {mib} MiB > {CARD_MIB}"
        assert whole.get(key, 0) == 0, f"card {key} is shared with a whole-card pod"
    assert all(count == 1 for count in whole.values())


async def test_sigkill_during_a_burst_loses_nothing_and_double_books_nothing(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    nodes, cards = 10, 8
    for n in range(nodes):
        await create_gpu_node(
            core, FakeGpuNode(name=f"n{n:02d}", gpu_memory=cards * CARD_MIB, gpu_number=cards)
        )
    operator = start_operator()
    rng = random.Random(3)
    sizes = [1024, 2048, 4096, 6000]
    names = [f"burst-{i:03d}" for i in range(200)]
    limit = asyncio.Semaphore(16)

    async def create(name: str) -> None:
        async with limit:
            body = (
                gpu_pod(name, number=1) if rng.random() < 0.05 else gpu_pod(name, rng.choice(sizes))
            )
            await create_pod(core, body)

    assigner = asyncio.create_task(act_as_device_plugins(api))
    creating = asyncio.gather(*(create(name) for name in names))
    for already in (40, 100):  # kill it twice, mid-burst
        await eventually(
            lambda: _count_bound(core, at_least=already),  # noqa: B023 (awaited at once)
            timeout_s=60,
            what=f"{already} pods bound",
        )
        operator.kill()
        await asyncio.sleep(0.5)
        operator.start()
    await creating

    async def settled() -> list[dict[str, Any]] | None:
        pods = await list_pods(core)
        done = all(p["spec"].get("nodeName") or is_unschedulable(p) for p in pods)
        return pods if done and len(pods) == len(names) else None

    try:
        pods = await eventually(settled, timeout_s=120, what="every pod bound or unschedulable")
    finally:
        assigner.cancel()
        await asyncio.gather(assigner, return_exceptions=True)
    assert_no_card_over_capacity(pods, cards)
    for pod in pods:
        name = pod["metadata"]["name"]
        reasons = [e["reason"] for e in await events_of(core, name)]
        if pod["spec"].get("nodeName"):
            assert reasons.count("Scheduled") <= 1, f"{name} scheduled twice"
        else:
            assert "FailedScheduling" in reasons, f"{name} waits without a reason"
    assert sum(1 for p in pods if p["spec"].get("nodeName")) > 150


async def _count_bound(core: client.CoreV1Api, *, at_least: int) -> bool:
    pods = await list_pods(core)
    return sum(1 for p in pods if p["spec"].get("nodeName")) >= at_least


async def test_a_standby_takes_over_within_the_lease_duration(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=8 * CARD_MIB, gpu_number=8))
    first = start_operator("op-a")
    first.wait_logged("started_leading", timeout_s=10)
    second = start_operator("op-b")
    await create_pod(core, gpu_pod("before", 1024))
    await bound(core, "before")
    assert not any(line.get("event") == "started_leading" for line in second.log_events())
    assert not any(line.get("event") == "pod_bound" for line in second.log_events())

    first.kill()
    killed = time.monotonic()
    second.wait_logged("started_leading", timeout_s=15)
    took_over = time.monotonic() - killed
    assert took_over <= 4 + 1 + 1  # lease duration, retry period, slack
    await create_pod(core, gpu_pod("after", 1024))
    pod = await bound(core, "after")
    assert gpu_index(pod) == "0"  # the standby's warm cache knows card 0 holds "before"
    assert any(line.get("event") == "pod_bound" for line in second.log_events())


async def test_a_clean_shutdown_hands_over_at_once(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    first = start_operator("op-a")
    first.wait_logged("started_leading", timeout_s=10)
    second = start_operator("op-b")
    assert first.stop() == 0
    stopped = time.monotonic()
    second.wait_logged("started_leading", timeout_s=10)
    assert time.monotonic() - stopped < 2.5


async def test_bad_input_gets_a_clear_reason_and_harms_no_one_else(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="good", gpu_memory=CARD_MIB, gpu_number=1))
    await create_gpu_node(core, FakeGpuNode(name="odd-capacity", gpu_memory=1000, gpu_number=3))
    await create_gpu_node(
        core,
        FakeGpuNode(
            name="odd-health",
            gpu_memory=CARD_MIB,
            gpu_number=1,
            annotations={contract.GPU_UNHEALTHY_IDS: "0,,1"},
        ),
    )
    operator = start_operator()
    await create_pod(core, gpu_pod("gib", "1Gi"))
    await create_pod(core, gpu_pod("both", 1024, number=1))
    await create_pod(core, gpu_pod("fine", 1024))
    assert (await bound(core, "fine"))["spec"]["nodeName"] == "good"
    assert "uses a binary suffix" in await unschedulable_message(core, "gib")
    assert "asks for both volcano.sh/gpu-memory and volcano.sh/gpu-number" in (
        await unschedulable_message(core, "both")
    )
    for name in ("gib", "both"):
        warnings = [e for e in await events_of(core, name) if e["reason"] == "FailedScheduling"]
        assert len(warnings) == 1
    await create_pod(core, gpu_pod("big", 5000))
    await create_pod(core, gpu_pod("too-big", 20000))
    message = await unschedulable_message(core, "too-big")
    assert (
        "odd-capacity: node odd-capacity has capacity volcano.sh/gpu-memory=1000, not "
        "divisible by volcano.sh/gpu-number=3" in message
    )
    assert "odd-health: node odd-health: annotation volcano.sh/gpu-unhealthy-ids='0,,1'" in message
    assert (await bound(core, "big"))["spec"]["nodeName"] == "good"
    assert operator.running

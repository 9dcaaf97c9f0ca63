"""The operator places and binds pods the way the guide shows, and better."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cluster import (
    bound,
    create_gpunode,
    create_pod,
    events_of,
    eventually,
    gpu_index,
    gpu_pod,
    read_pod,
    unschedulable,
)
from kubernetes_asyncio import client

from gpushare.model import contract
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_harness.operator import OperatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]


async def scheduled_messages(core: client.CoreV1Api, name: str) -> list[str]:
    async def probe() -> list[str]:
        return [e["message"] for e in await events_of(core, name) if e["reason"] == "Scheduled"]

    return await eventually(probe, what=f"the Scheduled event of {name}")


async def test_the_guides_two_pods_share_card_zero(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="gpu-node-1", gpu_memory=89424, gpu_number=8))
    start_operator()
    for name in ("gpu-pod1", "gpu-pod2"):
        await create_pod(core, gpu_pod(name, 1024))
    for name, left in (("gpu-pod1", 10154), ("gpu-pod2", 9130)):
        pod = await bound(core, name)
        assert pod["spec"]["nodeName"] == "gpu-node-1"
        assert gpu_index(pod) == "0"
        assert pod["metadata"]["annotations"][contract.PREDICATE_TIME].isdigit()
        # Decisions are taken one at a time, in arrival order.
        assert await scheduled_messages(core, name) == [
            f"Successfully assigned default/{name} to gpu-node-1, card 0 "
            f"({left} MiB free left on the card)"
        ]


async def test_gpu_pods_made_before_the_label_are_labelled_and_others_are_not(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    """GPU pods made before gpushare labelled them (or while it was not installed: no webhook
    here) come under the placement policy: a running one is labelled through pods/status, a
    pending one with its Binding; a pod without GPUs and a finished GPU pod are left alone."""
    await create_gpu_node(core, FakeGpuNode(name="gpu-node-1", gpu_memory=89424, gpu_number=8))
    await create_pod(core, gpu_pod("running", 1024, nodeName="gpu-node-1"))
    await create_pod(core, gpu_pod("plain", nodeName="gpu-node-1"))
    await create_pod(core, gpu_pod("finished", 1024, nodeName="gpu-node-1"))
    await core.patch_namespaced_pod_status(
        "finished", "default", {"status": {"phase": "Succeeded"}}
    )
    start_operator()
    await create_pod(core, gpu_pod("pending", 1024))

    async def labels(name: str) -> dict[str, str]:
        return (await read_pod(core, name))["metadata"].get("labels") or {}

    async def labelled() -> bool:
        return all(
            [contract.GPU_POD_LABEL in await labels(name) for name in ("running", "pending")]
        )

    await eventually(labelled, what="the GPU pod label on running and pending")
    # Who wrote the label: the apiserver records a pods/status write in managedFields (under
    # the writer's user agent), not what a Binding adds.
    label_writers = {
        name: [
            (entry["manager"], entry.get("subresource"))
            for entry in (await read_pod(core, name))["metadata"]["managedFields"]
            if f"f:{contract.GPU_POD_LABEL}"
            in entry.get("fieldsV1", {}).get("f:metadata", {}).get("f:labels", {})
        ]
        for name in ("running", "pending")
    }
    assert label_writers == {"running": [("gpushare-scheduler", "status")], "pending": []}
    assert (await bound(core, "pending"))["metadata"]["labels"][contract.GPU_POD_LABEL] == "true"
    for name in ("plain", "finished"):
        assert contract.GPU_POD_LABEL not in await labels(name)


async def test_bestfit_picks_the_tightest_card_across_heterogeneous_nodes(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="big", gpu_memory=163118, gpu_number=2))
    await create_gpunode(api, "big", [81559, 81559])
    await create_gpu_node(core, FakeGpuNode(name="mixed", gpu_memory=65536, gpu_number=2))
    await create_gpunode(api, "mixed", [40960, 24576])
    start_operator()
    await create_pod(core, gpu_pod("p20", 20000))
    assert (await bound(core, "p20"))["spec"]["nodeName"] == "mixed"
    assert gpu_index(await read_pod(core, "p20")) == "1"  # 24576: the tightest
    await create_pod(core, gpu_pod("p30", 30000))
    pod = await bound(core, "p30")
    assert (pod["spec"]["nodeName"], gpu_index(pod)) == ("mixed", "0")


async def test_firstfit_reproduces_volcanos_lowest_index(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="mixed", gpu_memory=65536, gpu_number=2))
    await create_gpunode(api, "mixed", [40960, 24576])
    start_operator(GPUSHARE_POLICY="firstfit")
    await create_pod(core, gpu_pod("p20", 20000))
    assert gpu_index(await bound(core, "p20")) == "0"


async def test_multi_container_and_init_container_pods_take_their_total_on_one_card(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=22356, gpu_number=2))
    start_operator()
    second = {
        "name": "helper",
        "image": "busybox",
        "resources": {"limits": {contract.GPU_MEMORY: "3000"}},
    }
    init = [
        {
            "name": "warmup",
            "image": "busybox",
            "resources": {"limits": {contract.GPU_MEMORY: "9000"}},
        }
    ]
    await create_pod(core, gpu_pod("two", 5000, extra_containers=[second]))  # 8000 together
    await create_pod(core, gpu_pod("init", 1000, initContainers=init))  # 9000 at peak
    two = await bound(core, "two")
    init_pod = await bound(core, "init")
    assert {gpu_index(two), gpu_index(init_pod)} == {"0", "1"}  # 8000 + 9000 > one card


async def test_whole_cards_go_to_idle_cards_beside_shared_ones(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=44712, gpu_number=4))
    start_operator()
    await create_pod(core, gpu_pod("shared", 1024))
    assert gpu_index(await bound(core, "shared")) == "0"
    await create_pod(core, gpu_pod("whole", number=3))
    assert gpu_index(await bound(core, "whole")) == "1,2,3"
    await create_pod(core, gpu_pod("more", number=1))
    message = await unschedulable(core, "more")
    assert "card 0 in use" in message
    assert "cards 1-3 held whole by a gpu-number pod" in message
    await create_pod(core, gpu_pod("small", 1024))
    assert gpu_index(await bound(core, "small")) == "0"  # shares card 0, never 1-3


async def test_unhealthy_cards_are_skipped(core: client.CoreV1Api, start_operator: Start) -> None:
    await create_gpu_node(
        core,
        FakeGpuNode(
            name="n", gpu_memory=22356, gpu_number=2, annotations={contract.GPU_UNHEALTHY_IDS: "0"}
        ),
    )
    start_operator()
    await create_pod(core, gpu_pod("p", 1024))
    assert gpu_index(await bound(core, "p")) == "1"


async def test_nodes_that_cannot_run_the_pod_are_skipped_with_their_reason(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    for node in (
        FakeGpuNode(name="a-no-gpu", gpu_memory=0, gpu_number=0),
        FakeGpuNode(name="b-cordoned", gpu_memory=11178, gpu_number=1, unschedulable=True),
        FakeGpuNode(
            name="c-tainted",
            gpu_memory=11178,
            gpu_number=1,
            taints=[client.V1Taint(key="dedicated", value="ml", effect="NoSchedule")],
        ),
        FakeGpuNode(name="d-not-ready", gpu_memory=11178, gpu_number=1, ready=False),
        FakeGpuNode(name="e-small-cpu", gpu_memory=11178, gpu_number=1, cpu="1"),
    ):
        await create_gpu_node(core, node)
    start_operator()
    pod = gpu_pod("p", 1024)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    await create_pod(core, pod)
    message = await unschedulable(core, "p")
    assert message.startswith("0/5 nodes are available:")
    for expected in (
        "b-cordoned: node(s) were unschedulable",
        "c-tainted: node(s) had untolerated taint {dedicated: ml}",
        "d-not-ready: node(s) were not ready",
        "e-small-cpu: Insufficient cpu",
        "a-no-gpu: no GPU",
    ):
        assert expected in message
    warnings = [e for e in await events_of(core, "p") if e["reason"] == "FailedScheduling"]
    assert [e["message"] for e in warnings] == [message]

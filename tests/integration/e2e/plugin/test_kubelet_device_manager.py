"""The device plugin driven by the kubelet's own device-manager code (kubelet-devices), with
the real apiserver holding the pods and the real operator placing them.

What a user sees is asserted: the container env the kubelet would hand to the runtime, the
device ids the kubelet recorded, node capacity, pod annotations and status, the GPUNode spec.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import bind_pod, bound, create_pod, eventually, gpu_index, gpu_pod, read_pod
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare.model.annotations import CardIndex
from gpushare.model.devices import CardDevices, memory_message_size, smallest_fitting_unit
from gpushare.model.limits import LimitSettings, framework_limits
from gpushare_harness import ControlPlane
from gpushare_harness.controlplane import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

GUIDE_CARD = 11178


def guide_env(card: str, allocated: int, total: int = GUIDE_CARD) -> dict[str, str]:
    """What Allocate gives a gpu-memory container: Volcano's three variables and the
    frameworks' limits for its share (gpushare.model.limits, the plugin's defaults)."""
    return {
        contract.ENV_VISIBLE_DEVICES: card,
        contract.ENV_GPU_ALLOCATED: str(allocated),
        contract.ENV_GPU_MEMORY_TOTAL: str(total),
        **framework_limits(allocated, total, LimitSettings()).env,
    }


async def started(node: Any, pod: str, container: str = "cuda-container") -> dict[str, Any]:
    line: dict[str, Any] = await asyncio.to_thread(
        node.kubelet.wait_started, f"default/{pod}", container
    )
    return line


async def gpunode(api: client.ApiClient, name: str) -> dict[str, Any]:
    return await raw_json(
        client.CustomObjectsApi(api).get_cluster_custom_object(
            "gpushare.io", "v1alpha1", "gpunodes", name, _preload_content=False
        )
    )


async def node_status(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    return await raw_json(core.read_node(name, _preload_content=False))


async def test_the_guides_two_pods_get_card_0_and_the_guides_env(
    core: client.CoreV1Api, gpu_node: Callable[..., Any], start_operator: Callable[..., Any]
) -> None:
    node = await gpu_node("gpu-node-1", "8x11178")
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, "89424")
    status = await node_status(core, "gpu-node-1")
    assert status["status"]["capacity"][contract.GPU_MEMORY] == "89424"
    assert status["status"]["capacity"][contract.GPU_NUMBER] == "8"
    start_operator()
    for name in ("gpu-pod1", "gpu-pod2"):
        await create_pod(core, gpu_pod(name, 1024))
    for name in ("gpu-pod1", "gpu-pod2"):
        line = await started(node, name)
        assert line["envs"] == guide_env("0", 1024)
        ids = line["devices"][contract.GPU_MEMORY]
        assert len(ids) == 1024
        assert all(i.startswith("0-") for i in ids)  # the kubelet's records name card 0 too

        async def running(pod: str = name) -> dict[str, Any] | None:
            body = await read_pod(core, pod)
            marked = body["metadata"]["annotations"].get(contract.GPU_ASSIGNED) == "true"
            return body if body["status"].get("phase") == "Running" and marked else None

        # gpu-assigned: by the plugin, once it has seen the kubelet start the pod.
        pod = await eventually(running, what=f"{name} Running and marked gpu-assigned")
        annotations = pod["metadata"]["annotations"]
        assert annotations[contract.GPU_INDEX] == "0"
        assert annotations[contract.PREDICATE_TIME].isdigit()


async def test_heterogeneous_cards_report_their_own_size_and_ids(
    core: client.CoreV1Api, gpu_node: Callable[..., Any], start_operator: Callable[..., Any]
) -> None:
    node = await gpu_node("mixed", "1x40960,1x81920")
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, str(40960 + 81920))
    start_operator()
    await create_pod(core, gpu_pod("big", 50000))  # fits only card 1
    line = await started(node, "big")
    assert line["envs"] == guide_env("1", 50000, 81920)
    assert all(i.startswith("1-") for i in line["devices"][contract.GPU_MEMORY])
    await create_pod(core, gpu_pod("small", 30000))  # best-fit: card 1 has 31920 left
    line = await started(node, "small")
    assert line["envs"] == guide_env("1", 30000, 81920)
    await create_pod(core, gpu_pod("third", 30000))  # only card 0 can take it now
    line = await started(node, "third")
    assert line["envs"] == guide_env("0", 30000, 40960)
    assert all(i.startswith("0-") for i in line["devices"][contract.GPU_MEMORY])


async def test_a_two_container_pod_and_an_init_container_each_get_their_share(
    core: client.CoreV1Api, gpu_node: Callable[..., Any], start_operator: Callable[..., Any]
) -> None:
    node = await gpu_node("n", "2x11178")
    start_operator()
    second = {
        "name": "second",
        "image": "busybox",
        "resources": {"limits": {contract.GPU_MEMORY: "2048"}},
    }
    init = {
        "name": "warmup",
        "image": "busybox",
        "resources": {"limits": {contract.GPU_MEMORY: "512"}},
    }
    await create_pod(core, gpu_pod("two", 1024, extra_containers=[second], initContainers=[init]))
    pod = await bound(core, "two")
    card = gpu_index(pod)
    assert card is not None
    assert (await started(node, "two", "warmup"))["envs"] == guide_env(card, 512)
    assert (await started(node, "two", "cuda-container"))["envs"] == guide_env(card, 1024)
    assert (await started(node, "two", "second"))["envs"] == guide_env(card, 2048)

    async def assigned() -> bool:
        body = await read_pod(core, "two")
        return bool(body["metadata"]["annotations"].get(contract.GPU_ASSIGNED) == "true")

    await eventually(assigned, what="gpu-assigned after the last container")


async def test_whole_cards_are_steered_to_the_pods_cards(
    core: client.CoreV1Api,
    api: client.ApiClient,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
) -> None:
    node = await gpu_node("n", "4x11178")
    start_operator()
    await create_pod(core, gpu_pod("first", 1024))
    await started(node, "first")
    await create_pod(core, gpu_pod("whole", number=2))
    line = await started(node, "whole")
    pod = await read_pod(core, "whole")
    cards = gpu_index(pod)
    assert cards is not None
    assert "0" not in cards.split(",")  # card 0 holds a share: not whole any more
    assert line["envs"][contract.ENV_VISIBLE_DEVICES] == cards
    assert line["envs"][contract.ENV_GPU_ALLOCATED] == str(2 * GUIDE_CARD)
    spec = (await gpunode(api, "n"))["spec"]
    uuids = {str(c["index"]): c["uuid"] for c in spec["cards"]}
    assert sorted(line["devices"][contract.GPU_NUMBER]) == sorted(
        uuids[i] for i in cards.split(",")
    )


async def test_a_pod_not_placed_by_the_operator_fails_to_start_with_a_clear_reason(
    core: client.CoreV1Api, gpu_node: Callable[..., Any]
) -> None:
    # Refused at once (it held the node's admissions 10 s before), not after the watch's
    # full grace, here 60 s, three times the wait for the refusal: the plugin sees the pod
    # that no scheduler placed.
    node = await gpu_node("n", "2x11178", plugin_env={"GPUSHARE_ALLOCATE_WAIT_SECONDS": "60"})
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, str(2 * GUIDE_CARD))
    stray = await create_pod(core, gpu_pod("stray", 1024, scheduler="default-scheduler"))
    await bind_pod(core, stray, "n", {})
    line = await asyncio.to_thread(node.kubelet.wait_rejected, "default/stray")
    assert "without volcano.sh/gpu-index" in line["message"]
    assert "schedulerName" in line["message"]

    async def failed() -> dict[str, Any] | None:
        body = await read_pod(core, "stray")
        return body if body["status"].get("phase") == "Failed" else None

    pod = await eventually(failed, what="stray to fail admission")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"

    # A pod of another scheduler with a gpu-index it wrote itself: not ours, never served.
    foreign = await create_pod(core, gpu_pod("foreign", 1024, scheduler="default-scheduler"))
    forged = {contract.GPU_INDEX: "0", contract.PREDICATE_TIME: str(time.time_ns())}
    await bind_pod(core, foreign, "n", forged)
    line = await asyncio.to_thread(node.kubelet.wait_rejected, "default/foreign")
    assert "without volcano.sh/gpu-index from the gpushare scheduler" in line["message"]
    assert not node.kubelet.started("default/foreign")
    # A gpu-index naming a card the node lacks: refused, never another card.
    lost = await create_pod(core, gpu_pod("lost", 1024))
    await bind_pod(core, lost, "n", {**forged, contract.GPU_INDEX: "9"})
    line = await asyncio.to_thread(node.kubelet.wait_rejected, "default/lost")
    assert "card 9, which the node does not have" in line["message"]
    assert not node.kubelet.started("default/lost")


async def test_a_bypassing_pod_never_takes_the_card_of_a_placed_pod_of_the_same_size(
    core: client.CoreV1Api, gpu_node: Callable[..., Any], start_operator: Callable[..., Any]
) -> None:
    # The watch's full grace far longer than the waits below: a refusal that waited it out
    # (holding the kubelet, which admits one pod at a time) would time them out.
    node = await gpu_node("n", "2x11178", plugin_env={"GPUSHARE_ALLOCATE_WAIT_SECONDS": "60"})
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, str(2 * GUIDE_CARD))
    start_operator()
    # Created on the node directly, just before a pod the operator places, same size: the
    # kubelet's Allocate could be for either, and the plugin must not guess.
    await create_pod(core, gpu_pod("bypass", 1024, scheduler="default-scheduler", nodeName="n"))
    await create_pod(core, gpu_pod("good", 1024))
    refused = await asyncio.to_thread(node.kubelet.wait_rejected, "default/bypass")
    # Its kubelet's records say which pod it starts, and the reason says what to do.
    assert "create it with spec.schedulerName set to one the operator serves" in refused["message"]
    assert "default/good" not in refused["message"]  # another pod's name is not shown
    line = await started(node, "good")  # not held up by it
    card = gpu_index(await read_pod(core, "good"))
    assert card is not None
    assert line["envs"] == guide_env(card, 1024)
    assert not node.kubelet.started("default/bypass")


async def test_a_kubelet_restart_makes_the_plugin_register_again(
    core: client.CoreV1Api, gpu_node: Callable[..., Any], start_operator: Callable[..., Any]
) -> None:
    node = await gpu_node("n", "2x11178")
    start_operator()
    await create_pod(core, gpu_pod("before", 1024))
    await started(node, "before")
    mark = len(node.plugin.log_events())
    node.kubelet.restart()
    await asyncio.to_thread(node.plugin.wait_logged, "re-registering", timeout_s=20, after=mark)
    await asyncio.to_thread(node.plugin.wait_registered, after=mark)
    await create_pod(core, gpu_pod("after", 2048))
    line = await started(node, "after")
    assert line["envs"] == guide_env("0", 2048)


async def test_a_gpunode_is_ready_while_its_plugin_beats_and_stale_once_it_stops(
    api: client.ApiClient,
    plane: ControlPlane,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
) -> None:
    node = await gpu_node("beating", "2x11178", plugin_args=["--heartbeat-seconds=0.5"])
    start_operator(GPUSHARE_PLUGIN_STALE_AFTER="3")

    async def conditions() -> dict[str, str]:
        found = (await gpunode(api, "beating")).get("status", {}).get("conditions", [])
        return {c["type"]: c["status"] for c in found}

    async def ready() -> bool:
        return await conditions() == {
            "Ready": "True",
            "Stale": "False",
            "DoubleAdvertised": "False",
        }

    await eventually(ready, timeout_s=15, what="Ready")
    kubectl = [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig)]
    listed = (
        await asyncio.to_thread(
            subprocess.run,
            [*kubectl, "get", "gpunodes"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    ).stdout
    assert listed.split("\n")[0].split()[:2] == ["NAME", "READY"]
    assert listed.split("\n")[1].split()[:2] == ["beating", "True"]

    node.plugin.stop()

    async def stale() -> bool:
        return await conditions() == {
            "Ready": "False",
            "Stale": "True",
            "DoubleAdvertised": "False",
        }

    await eventually(stale, timeout_s=15, what="Stale once the plugin stopped")


async def test_a_node_nvidias_plugin_also_advertises_is_flagged_with_the_fix(
    core: client.CoreV1Api,
    api: client.ApiClient,
    plane: ControlPlane,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
) -> None:
    await gpu_node("both", "2x11178")
    start_operator()
    nvidia = {"nvidia.com/gpu": "2"}
    # As NVIDIA's device plugin registering beside ours makes the kubelet write it.
    await core.patch_node_status("both", {"status": {"capacity": nvidia, "allocatable": nvidia}})

    async def flagged() -> dict[str, Any] | None:
        found = (await gpunode(api, "both")).get("status", {}).get("conditions", [])
        double = [c for c in found if c["type"] == "DoubleAdvertised"]
        return double[0] if double and double[0]["status"] == "True" else None

    condition = await eventually(flagged, timeout_s=15, what="DoubleAdvertised")
    assert "nvidia.com/gpu: 2" in condition["message"]
    kubectl = [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig)]
    described = await asyncio.to_thread(
        subprocess.run,
        [*kubectl, "describe", "node", "both"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "DoubleAdvertised" in described.stdout
    assert "nvidia.com/gpu.deploy.device-plugin=false" in described.stdout


async def test_an_xid_makes_the_card_unhealthy_and_recovery_restores_it(
    core: client.CoreV1Api,
    api: client.ApiClient,
    gpu_node: Callable[..., Any],
    tmp_path: Path,
) -> None:
    spec = tmp_path / "cards.yaml"
    cards = [{"memoryMiB": GUIDE_CARD}, {"memoryMiB": GUIDE_CARD}]
    spec.write_text(yaml.safe_dump({"cards": cards}))
    node = await gpu_node("n", f"@{spec}", plugin_env={"GPUSHARE_HEALTH_RECOVERY_SECONDS": "1"})
    full = str(2 * GUIDE_CARD)
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, full, allocatable=True)

    cards[1]["xid"] = 43  # an application error: says nothing about the card
    spec.write_text(yaml.safe_dump({"cards": cards}))
    await asyncio.to_thread(node.plugin.wait_logged, "XID event changes nothing", timeout_s=10)
    cards[1]["xid"] = 79  # fallen off the bus
    spec.write_text(yaml.safe_dump({"cards": cards}))
    await asyncio.to_thread(
        node.kubelet.wait_capacity, contract.GPU_MEMORY, str(GUIDE_CARD), allocatable=True
    )
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_NUMBER, "1", allocatable=True)

    async def marked() -> dict[str, Any] | None:
        body = await node_status(core, "n")
        annotations = body["metadata"].get("annotations", {})
        return body if annotations.get(contract.GPU_UNHEALTHY_IDS) == "1" else None

    await eventually(marked, what="the node annotation to name card 1")
    health = [c["health"] for c in (await gpunode(api, "n"))["spec"]["cards"]]
    assert health == ["Healthy", "Unhealthy"]

    del cards[1]["xid"]  # the driver answers normally again
    spec.write_text(yaml.safe_dump({"cards": cards}))
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, full, allocatable=True)

    async def cleared() -> bool:
        body = await node_status(core, "n")
        return contract.GPU_UNHEALTHY_IDS not in body["metadata"].get("annotations", {})

    await eventually(cleared, what="the unhealthy annotation to go")
    health = [c["health"] for c in (await gpunode(api, "n"))["spec"]["cards"]]
    assert health == ["Healthy", "Healthy"]


async def test_sigterm_removes_the_sockets_and_a_crash_leaves_none_that_blocks(
    gpu_node: Callable[..., Any],
) -> None:
    node = await gpu_node("n", "1x11178")
    sockets = {"volcano-gpu-memory.sock", "volcano-gpu-number.sock"}
    assert sockets <= {p.name for p in node.plugin.socket_dir.iterdir()}
    node.plugin.kill()  # a crash leaves the sockets behind
    assert sockets <= {p.name for p in node.plugin.socket_dir.iterdir()}
    node.plugin.start()  # reclaims them and registers
    assert node.plugin.stop() == 0
    assert not sockets & {p.name for p in node.plugin.socket_dir.iterdir()}


async def test_a_node_of_eight_141_gib_cards_is_listed_under_the_kubelets_limit(
    api: client.ApiClient, gpu_node: Callable[..., Any]
) -> None:
    sizes = [CardDevices(index=CardIndex(i), memory_mib=144384) for i in range(8)]
    unit = smallest_fitting_unit(sizes)
    assert unit > 1
    assert memory_message_size(sizes, unit) <= 4 * 1024 * 1024
    refused = await gpu_node("refused", "8x144384", wait_registered=False)
    assert await asyncio.to_thread(refused.plugin.wait_exit) == 2
    refusal = refused.plugin.wait_logged("refusing to start", timeout_s=1)
    assert f"use --gpu-memory-factor={unit} or larger" in refusal["error"]

    node = await gpu_node("auto", "8x144384", plugin_args=["--gpu-memory-factor=auto"])
    units = 8 * (144384 // unit)
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, str(units))
    assert (await gpunode(api, "auto"))["spec"]["memoryUnitMiB"] == unit


async def test_at_the_default_unit_eight_141_gib_cards_are_listed_without_choosing_anything(
    api: client.ApiClient, gpu_node: Callable[..., Any]
) -> None:
    default = contract.DEFAULT_MEMORY_UNIT_MIB
    sizes = [CardDevices(index=CardIndex(i), memory_mib=144384) for i in range(8)]
    assert memory_message_size(sizes, default) <= 64 * 1024  # the limit is 4 MiB
    node = await gpu_node("h200", "8x144384", unit_mib=None)
    units = 8 * (144384 // default)
    await asyncio.to_thread(node.kubelet.wait_capacity, contract.GPU_MEMORY, str(units))
    assert (await gpunode(api, "h200"))["spec"]["memoryUnitMiB"] == default


async def test_the_inventory_is_owned_by_the_node_and_metrics_count_allocations(
    core: client.CoreV1Api,
    api: client.ApiClient,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
) -> None:
    port = free_port()
    node = await gpu_node("n", "2x11178", plugin_env={"GPUSHARE_METRICS_PORT": str(port)})
    node_uid = (await node_status(core, "n"))["metadata"]["uid"]
    inventory = await gpunode(api, "n")
    assert inventory["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": node_uid}
    ]
    spec = inventory["spec"]
    assert (spec["memoryUnitMiB"], spec["pluginVersion"]) == (1, "0.1.0")
    # The default: an admin sees that containers are told their cards by env alone.
    assert spec["deviceListStrategy"] == "envvar"
    assert spec["schedulerNames"] == ["volcano"]  # the operator places no other pods here
    assert [(c["index"], c["memoryMiB"], c["health"]) for c in spec["cards"]] == [
        (0, 11178, "Healthy"),
        (1, 11178, "Healthy"),
    ]
    start_operator()
    await create_pod(core, gpu_pod("p", 1024))
    await started(node, "p")
    stray = await create_pod(core, gpu_pod("stray", 512, scheduler="default-scheduler"))
    await bind_pod(core, stray, "n", {})
    await asyncio.to_thread(node.kubelet.wait_rejected, "default/stray")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    metrics = await asyncio.to_thread(scrape)
    # Every series names the plugin's node (`node`, labels in name order).
    memory = 'node="n",resource="volcano.sh/gpu-memory"'
    assert f'gpushare_plugin_allocate_total{{{memory},result="ok"}} 1.0' in metrics
    assert f'gpushare_plugin_allocate_total{{{memory},result="no_candidate"}} 1.0' in metrics
    assert f'gpushare_plugin_devices{{health="Healthy",{memory}}} 22356.0' in metrics
    assert (
        'gpushare_plugin_devices{health="Healthy",node="n",resource="volcano.sh/gpu-number"} 2.0'
        in metrics
    )
    assert "gpushare_plugin_allocate_seconds_bucket" in metrics

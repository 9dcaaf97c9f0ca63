"""The fault campaign: a 1,000-pod burst over 50 GPU nodes (each with the device plugin and
the kubelet's device manager) while things break, then the invariants.

During the burst: the operator leader is SIGKILLed three times (two replicas, Lease election),
the apiserver is restarted, device plugins are SIGKILLed and restarted, kubelets restarted,
a node with pods on it is deleted (its pods go, as the pod garbage collector would remove
them), and pods are deleted while they are being bound. Afterwards:
- no card is over capacity and no whole card is shared;
- every bound GPU pod has a valid `gpu-index` for its node;
- every served container's env names the card(s) of its pod's annotation;
- every pod is bound at most once by the operator, and is either bound or Unschedulable with
  a FailedScheduling event;
- every bound pod was served (Running), or refused by the kubelet with the reason.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.model import contract
from gpushare.model.annotations import parse_card_indices
from gpushare.model.bound import kubelet_order
from gpushare.model.inventory import NodeInventory, node_inventory
from gpushare.model.request import GpuKind, gpu_request
from gpushare.model.usage import Ledger, check_allocation, claim_of
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.identities import operator_kubeconfig, plugin_kubeconfig
from gpushare_harness.kubelet import KubeletHarness
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.plugin import PluginProcess

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(900)]

NODES = 50
PODS = 1000
CARD = 11178
SEED = 20261202
# 64 MiB per device (174 per card): at 1 MiB a node lists 89,424 devices, and the kubelet's
# device manager (1.36, ResourceHealthStatus on by default) then spends minutes holding its
# lock after a restart, comparing every device with every allocation
# (podDevices.getPodAndContainerForDevice builds a set per container per device): a kubelet
# restart on a busy 1 MiB node stalls admission for minutes. See the README's limits.
UNIT_MIB = 64
SIZES = (8, 16, 32, 64)  # units: 512 MiB to 4 GiB
TOO_BIG = "313"  # 20,032 MiB: more than any card


class FakeNode:
    def __init__(
        self, name: str, plane: ControlPlane, folder: Path, logs: Path, plugin_kubeconfig: Path
    ) -> None:
        self.name = name
        self.kubelet = KubeletHarness(
            node=name,
            kubeconfig=plane.kubeconfig,
            plugin_dir=folder,
            log=logs / f"{name}-kubelet.log",
        )
        self.plugin = PluginProcess(
            node=name,
            kubeconfig=plugin_kubeconfig,
            socket_dir=folder,
            fake_gpus=f"8x{CARD}",
            log=logs / f"{name}-plugin.log",
            args=[f"--gpu-memory-factor={UNIT_MIB}"],
        )


def manifest(number: int, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    limits: dict[str, str]
    if roll < 0.08:
        limits = {contract.GPU_NUMBER: str(rng.choice((1, 2)))}
    elif roll < 0.12:
        limits = {contract.GPU_MEMORY: TOO_BIG}  # larger than any card: Unschedulable
    else:
        limits = {contract.GPU_MEMORY: str(rng.choice(SIZES))}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"burst-{number:04d}"},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def retrying(call: Callable[[], Any], *, attempts: int = 60, missing_ok: bool = False) -> Any:
    """An API call that rides out the apiserver restart."""
    for attempt in range(attempts):
        try:
            return await call()
        except (aiohttp.ClientError, OSError, ApiError) as error:
            if isinstance(error, ApiError) and error.status == 404 and missing_ok:
                return None
            if isinstance(error, ApiError) and error.status not in (429, 500, 503):
                raise
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    return None


async def test_a_burst_through_crashes_restarts_and_deletions_keeps_every_invariant(
    plane: ControlPlane, api: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    restarting: list[float] = []  # when the apiserver restart began and ended (unix time)
    folders = Path(tempfile.mkdtemp(prefix="dp-faults-"))
    names = [f"gpu-{i:02d}" for i in range(NODES)]
    await asyncio.gather(
        *(create_gpu_node(core, FakeGpuNode(name=n, gpu_memory=0, gpu_number=0)) for n in names)
    )
    # Each component on its own identity: the plugins' tokens bound to their Nodes.
    plugin_configs = await asyncio.gather(
        *(plugin_kubeconfig(core, plane.kubeconfig, n, tmp_path / f"{n}.kubeconfig") for n in names)
    )
    nodes = [
        FakeNode(name, plane, folders / name, tmp_path, config)
        for name, config in zip(names, plugin_configs, strict=True)
    ]
    operator_config = await operator_kubeconfig(core, plane.kubeconfig, tmp_path / "op.kubeconfig")
    operators = [
        OperatorProcess(operator_config, tmp_path / f"op-{n}.log", identity=f"op-{n}")
        for n in ("a", "b")
    ]
    try:
        for node in nodes:
            node.kubelet.start()
            node.plugin.start(wait_registered=False)
        await asyncio.gather(
            *(asyncio.to_thread(n.plugin.wait_registered, timeout_s=180) for n in nodes)
        )
        for operator in operators:
            operator.start(wait_synced=False)
        await asyncio.to_thread(operators[0].wait_logged, "synced", timeout_s=60)

        created: list[str] = []
        deleted: set[str] = set()
        gone_nodes: set[str] = set()

        async def burst() -> None:
            limit = asyncio.Semaphore(16)

            async def one(number: int) -> None:
                body = manifest(number, rng)
                async with limit:
                    await retrying(
                        lambda: raw_json(
                            core.create_namespaced_pod(
                                "default", cast(client.V1Pod, body), _preload_content=False
                            )
                        )
                    )
                created.append(body["metadata"]["name"])

            await asyncio.gather(*(one(n) for n in range(PODS)))

        def leader() -> OperatorProcess:
            for operator in operators:
                leading = [
                    e.get("event")
                    for e in operator.log_events()[operator.log_start :]
                    if e.get("event") in ("started_leading", "stopped_leading")
                ]
                if operator.running and leading and leading[-1] == "started_leading":
                    return operator
            return operators[0]

        async def kill_leader() -> None:
            victim = leader()
            victim.kill()
            await asyncio.sleep(1)
            victim.start(wait_synced=False)

        async def delete_while_binding() -> None:
            """The newest pod, most likely still being placed or bound, is deleted."""
            for _ in range(20):
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                fresh = [n for n in created[-5:] if n not in deleted]
                if not fresh:
                    continue
                deleted.add(fresh[-1])
                await retrying(
                    lambda n=fresh[-1]: raw_json(  # type: ignore[misc]
                        core.delete_namespaced_pod(
                            n, "default", grace_period_seconds=0, _preload_content=False
                        )
                    ),
                    missing_ok=True,
                )

        async def delete_node(node: FakeNode) -> None:
            node.plugin.stop()
            node.kubelet.stop()
            gone_nodes.add(node.name)
            await retrying(lambda: raw_json(core.delete_node(node.name, _preload_content=False)))
            await retrying(
                lambda: raw_json(
                    core.delete_collection_namespaced_pod(
                        "default",
                        field_selector=f"spec.nodeName={node.name}",
                        grace_period_seconds=0,
                        _preload_content=False,
                    )
                )
            )

        async def faults() -> None:
            await asyncio.sleep(2)
            await kill_leader()
            await asyncio.sleep(2)
            restarting.append(time.time())
            await asyncio.to_thread(plane.restart_apiserver)
            restarting.append(time.time())
            await asyncio.sleep(2)
            for node in nodes[3:5]:
                node.plugin.kill()
                node.plugin.start(wait_registered=False)
            for node in nodes[5:7]:
                await asyncio.to_thread(node.kubelet.restart)
            await kill_leader()
            await asyncio.sleep(2)
            await delete_node(nodes[9])
            await asyncio.sleep(1)
            await kill_leader()

        await asyncio.gather(burst(), faults(), delete_while_binding())
        await settle(core, operators, deadline_s=240, gone_nodes=gone_nodes)
        await check_invariants(core, api, nodes, operators, gone_nodes=gone_nodes, deleted=deleted)
        # Every right a component uses is in its role. The one time a refusal is expected: an
        # apiserver starting answers before its RBAC caches are filled (forbidden for a
        # moment, with "clusterrole ... not found"), so refusals while it restarts are not
        # counted.
        started, ready = restarting
        for process in [*operators, *(node.plugin for node in nodes)]:
            refused = [
                event
                for event in process.log_events()
                if "is forbidden" in json.dumps(event)
                and not started <= stamp(event) <= ready + RBAC_WARM_UP_S
            ]
            assert not refused, f"{process.name} refused: {refused[:3]}"
    finally:
        for operator in operators:
            operator.stop()
        for node in nodes:
            node.plugin.stop()
            node.kubelet.stop()
        shutil.rmtree(folders, ignore_errors=True)


RBAC_WARM_UP_S = 10.0


def stamp(event: dict[str, Any]) -> float:
    """A log line's time (unix seconds)."""
    return datetime.datetime.fromisoformat(str(event.get("timestamp"))).timestamp()


def waiting_reason(pod: dict[str, Any]) -> str | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message", ""))
    return None


async def settle(
    core: client.CoreV1Api,
    operators: list[OperatorProcess],
    *,
    deadline_s: float,
    gone_nodes: set[str],
) -> None:
    """Until every pod is Running, refused by its kubelet, or Unschedulable with a reason.
    A bind in flight when its node was deleted lands on the gone node: such pods are deleted
    as kube-controller-manager's pod GC deletes pods bound to nodes that no longer exist."""
    deadline = time.monotonic() + deadline_s
    unsettled: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = (await raw_json(core.list_namespaced_pod("default", _preload_content=False)))[
            "items"
        ]
        for orphan in [p for p in pods if p["spec"].get("nodeName") in gone_nodes]:
            await retrying(
                lambda name=orphan["metadata"]["name"]: raw_json(  # type: ignore[misc]
                    core.delete_namespaced_pod(
                        name, "default", grace_period_seconds=0, _preload_content=False
                    )
                ),
                missing_ok=True,
            )
        pods = [p for p in pods if p["spec"].get("nodeName") not in gone_nodes]
        unsettled = [
            p
            for p in pods
            if not (
                p["status"].get("phase") in ("Running", "Failed")
                or (not p["spec"].get("nodeName") and waiting_reason(p))
            )
        ]
        if not unsettled:
            return
        await asyncio.sleep(1)
    raise AssertionError(
        f"{len(unsettled)} pods never settled:\n"
        + "\n".join(pod_state(p, operators) for p in unsettled[:5])
    )


def pod_state(pod: dict[str, Any], operators: list[OperatorProcess]) -> str:
    """What a reader needs to tell why a pod never settled: its state and what the operators
    logged about it."""
    name = pod["metadata"]["name"]
    annotations = pod["metadata"].get("annotations") or {}
    logged = [
        event
        for operator in operators
        for event in operator.log_events()
        if str(event.get("pod", "")).endswith(f"/{name}")
    ]
    return json.dumps(
        {
            "name": name,
            "node": pod["spec"].get("nodeName"),
            "limits": pod["spec"]["containers"][0]["resources"].get("limits"),
            "annotations": {k: v for k, v in annotations.items() if "volcano" in k},
            "status": pod["status"],
            "operator_log": logged[-20:],
        }
    )


async def check_invariants(
    core: client.CoreV1Api,
    api: client.ApiClient,
    nodes: list[FakeNode],
    operators: list[OperatorProcess],
    *,
    gone_nodes: set[str],
    deleted: set[str],
) -> None:
    pods = (await raw_json(core.list_namespaced_pod("default", _preload_content=False)))["items"]
    node_bodies = (await raw_json(core.list_node(_preload_content=False)))["items"]
    resources = (
        await raw_json(
            client.CustomObjectsApi(api).list_cluster_custom_object(
                "gpushare.io", "v1alpha1", "gpunodes", _preload_content=False
            )
        )
    )["items"]
    check_cards(pods, node_bodies, resources, gone_nodes)
    check_envs(pods, nodes)
    binds: Counter[str] = Counter()
    for operator in operators:
        binds.update(e["pod"] for e in operator.log_events() if e.get("event") == "pod_bound")
    assert max(binds.values()) == 1, binds.most_common(3)
    await check_outcomes(core, pods, deleted)


def check_cards(
    pods: list[dict[str, Any]],
    node_bodies: list[dict[str, Any]],
    resources: list[dict[str, Any]],
    gone_nodes: set[str],
) -> None:
    """Every bound GPU pod has a valid gpu-index; no card is over capacity or shared whole."""
    by_name = {r["metadata"]["name"]: r for r in resources}
    inventories: dict[str, NodeInventory] = {}
    ledger = Ledger()
    for body in node_bodies:
        inventory = node_inventory(body, by_name.get(body["metadata"]["name"]))
        assert inventory is not None
        inventories[inventory.node] = inventory
        ledger.set_node(inventory)
    for pod in pods:
        claim = claim_of(pod)
        if claim.allocation is None:
            continue
        assert claim.allocation.node not in gone_nodes
        check_allocation(claim.allocation, inventories[claim.allocation.node])
        ledger.add(claim.allocation)
    for usage in ledger.nodes().values():
        assert (usage.unattributed_memory, usage.unattributed_cards) == (0, 0)
        for card in usage.cards.values():
            where = (usage.inventory.node, card.card.index)
            assert card.used <= card.card.memory, where
            assert card.exclusive <= 1, where
            assert not card.exclusive or len(card.pods) == 1, (where, card.pods)


def check_envs(pods: list[dict[str, Any]], nodes: list[FakeNode]) -> None:
    """Every served container's env names the card(s) of its pod's annotation."""
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    served = 0
    for node in nodes:
        for line in node.kubelet.log_events():
            pod = by_uid.get(line.get("uid", ""))
            if line.get("event") != "started" or pod is None:
                continue
            request = gpu_request(pod)
            if request.kind is None:
                continue
            name = pod["metadata"]["name"]
            cards = parse_card_indices(
                pod["metadata"]["annotations"][contract.GPU_INDEX], key="gpu-index", owner=name
            )
            shown = parse_card_indices(
                line["envs"][contract.ENV_VISIBLE_DEVICES], key="env", owner=name
            )
            if request.kind is GpuKind.MEMORY:
                assert shown == cards, (name, shown, cards)
            else:
                assert set(shown) <= set(cards), (name, shown, cards)
                assert len(shown) == kubelet_order(request)[0].amount, (name, shown)
            served += 1
    assert served >= PODS // 2


async def check_outcomes(
    core: client.CoreV1Api, pods: list[dict[str, Any]], deleted: set[str]
) -> None:
    """Bound and served (or refused by the kubelet with its reason), or Unschedulable with a
    FailedScheduling event; the pods deleted mid-binding are gone."""
    unschedulable = too_big = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        assert name not in deleted
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        too_big += limits.get(contract.GPU_MEMORY) == TOO_BIG
        if pod["spec"].get("nodeName"):
            phase = pod["status"].get("phase")
            if phase == "Failed":  # refused at admission: the kubelet says why
                assert pod["status"].get("reason") == "UnexpectedAdmissionError", name
                assert pod["status"].get("message"), name
            else:
                assert phase == "Running", (name, phase)
            continue
        assert waiting_reason(pod), name
        events = (
            await raw_json(
                core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={name}", _preload_content=False
                )
            )
        )["items"]
        assert any(e["reason"] == "FailedScheduling" for e in events), name
        unschedulable += 1
    assert unschedulable >= too_big > 0

"""Bursts of GPU pods created at once: how the operator packed them, against the model placing
the same pods one by one in creation order (best-fit, `find_placement`), and what each pod
went through on the way (bound, assigned, reported unschedulable). For bench/burst.py and the
burst tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, watch

from gpushare import kube
from gpushare.model import Ledger, NodeInventory, Policy, gpu_request, node_inventory
from gpushare.model.annotations import gpu_assigned
from gpushare.model.bodies import annotations_of
from gpushare.model.placement import find_placement
from gpushare.model.usage import claim_of, pod_ref

Body = dict[str, Any]


@dataclass(frozen=True)
class Packing:
    cards_used: int
    """Cards holding at least one pod."""
    stranded_mib: int
    """Memory left free on those cards (the unit's remainder of each card not counted)."""
    unplaced: int
    """Pods that fit nowhere."""
    used: dict[tuple[str, int], int]
    """MiB in use per (node, card)."""

    def no_worse_than(self, other: Packing) -> bool:
        return (
            self.unplaced <= other.unplaced
            and self.cards_used <= other.cards_used
            and self.stranded_mib <= other.stranded_mib
        )


def _ledger(inventories: Iterable[NodeInventory]) -> Ledger:
    ledger = Ledger()
    for inventory in inventories:
        ledger.set_node(inventory)
    return ledger


def _packing(ledger: Ledger, unplaced: int) -> Packing:
    used: dict[tuple[str, int], int] = {}
    stranded = 0
    for node in ledger.nodes().values():
        unit = node.inventory.unit_mib
        for index, card in node.cards.items():
            if card.pods:
                used[(node.inventory.node, index)] = card.allocated * unit
                stranded += card.free * unit
    return Packing(len(used), stranded, unplaced, used)


def model_packing(inventories: Iterable[NodeInventory], pods_in_order: Iterable[Body]) -> Packing:
    """Best-fit placing `pods_in_order` one by one, each seeing all the earlier ones."""
    ledger = _ledger(inventories)
    unplaced = 0
    for pod in pods_in_order:
        found = find_placement(ledger, gpu_request(pod), Policy.BESTFIT)
        if found is None:
            unplaced += 1
        else:
            ledger.add(found.allocation(pod_ref(pod)))
    return _packing(ledger, unplaced)


def live_packing(inventories: Iterable[NodeInventory], pods: Iterable[Body]) -> Packing:
    """The packing the pods' `gpu-index` annotations show."""
    ledger = _ledger(inventories)
    unplaced = 0
    for pod in pods:
        allocation = claim_of(pod).allocation
        if allocation is None:
            unplaced += 1
        else:
            ledger.add(allocation)
    return _packing(ledger, unplaced)


async def inventories(api: client.ApiClient) -> list[NodeInventory]:
    """Every GPU node's inventory as the operator reads it (its GPUNode, else its capacity)."""
    core = client.CoreV1Api(api)
    nodes = await kube.raw_json(core.list_node(_preload_content=False))
    gpunodes = await kube.raw_json(
        client.CustomObjectsApi(api).list_cluster_custom_object(
            "gpushare.io", "v1alpha1", "gpunodes", _preload_content=False
        )
    )
    resources = {g["metadata"]["name"]: g for g in gpunodes["items"]}
    found = (node_inventory(n, resources.get(n["metadata"]["name"])) for n in nodes["items"])
    return [inventory for inventory in found if inventory is not None]


@dataclass
class BurstWatch:
    """What a watch of one namespace saw of each pod: when it was first bound and first
    assigned (monotonic), and which pods were ever shown `PodScheduled=False`."""

    namespace: str
    expected: int
    """Pods in the burst: `all_assigned` is set once that many are assigned."""
    all_assigned: asyncio.Event = field(default_factory=asyncio.Event)
    bound: dict[str, float] = field(default_factory=dict)
    assigned: dict[str, float] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)
    created_version: dict[str, str] = field(default_factory=dict)

    async def run(self, api: client.ApiClient, ready: asyncio.Event) -> None:
        core = client.CoreV1Api(api)
        async with watch.Watch() as stream:
            ready.set()
            async for event in stream.stream(
                core.list_namespaced_pod, self.namespace, _request_timeout=3600
            ):
                self.see(event["type"], event["raw_object"])

    def see(self, kind: str, pod: Body) -> None:
        name, now = pod["metadata"]["name"], time.monotonic()
        if kind == "ADDED":
            self.created_version.setdefault(name, pod["metadata"]["resourceVersion"])
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, now)
        if gpu_assigned(annotations_of(pod)):
            self.assigned.setdefault(name, now)
            if len(self.assigned) >= self.expected:
                self.all_assigned.set()
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions):
            self.reported.add(name)

    def ordered(self, pods: Iterable[Body]) -> list[Body]:
        """`pods` in the order their creations reached the watch."""
        return sorted(pods, key=lambda p: int(self.created_version[p["metadata"]["name"]]))

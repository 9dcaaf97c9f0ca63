"""A node's GPU cards: index, UUID, model, memory and health.

Two sources, in order of preference:
1. our GPUNode resource (spec written by the gpushare device plugin): real per-card sizes,
   UUIDs and health, so heterogeneous cards on one node are exact;
2. for nodes run by Volcano's own device plugin, `status.capacity`: `gpu-number` cards of
   `gpu-memory / gpu-number` units each, as Volcano's scheduler reads them.
Either way the node annotation `volcano.sh/gpu-unhealthy-ids` marks cards unhealthy too.

Memory is counted in the cluster's gpu-memory unit (MiB times the plugin's memory factor),
the unit pod limits are written in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NewType

from gpushare.model import contract
from gpushare.model.annotations import CardIndex, parse_card_indices
from gpushare.model.bodies import Body, annotations_of, describe, path, sequence, text
from gpushare.model.errors import InvalidInventory
from gpushare.model.quantity import parse_quantity

NodeName = NewType("NodeName", str)


class InventorySource(StrEnum):
    RESOURCE = "GPUNode resource"
    CAPACITY = "node capacity"


@dataclass(frozen=True, kw_only=True, slots=True)
class Card:
    index: CardIndex
    memory: int
    """Capacity in memory units."""
    healthy: bool
    uuid: str | None = None
    model: str | None = None
    memory_mib: int | None = None
    """The card's real size in MiB when the device plugin reported it (memory drops the
    remainder below one unit)."""

    @property
    def total_mib(self) -> int:
        """The card's size in MiB, as VOLCANO_GPU_MEMORY_TOTAL reports it."""
        return self.memory_mib if self.memory_mib is not None else self.memory


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeInventory:
    node: NodeName
    cards: tuple[Card, ...]
    """Sorted by index; never empty (a node without cards has no inventory)."""
    unit_mib: int
    """MiB per memory unit (the device plugin's memory factor)."""
    source: InventorySource
    identifies_pods: bool = False
    """The node's device plugin learns from the kubelet which pod each Allocate is for
    (GPUNode `spec.identifiesPods`): the exactness rule need not hold its cards back."""
    serves: frozenset[str] | None = None
    """The pods' schedulerNames the node's device plugin serves (GPUNode
    `spec.schedulerNames`); None: a plugin that does not say."""

    def card(self, index: CardIndex) -> Card | None:
        for card in self.cards:
            if card.index == index:
                return card
        return None


MAX_CARDS = 256
"""More GPUs than any node holds (8 or 16 in the largest today): a capacity that says more is
refused, not expanded card by card."""


def node_inventory(node: Body, resource: Body | None = None) -> NodeInventory | None:
    """The GPU inventory of `node`, from its GPUNode `resource` when there is one, else from
    its capacity; None when the node has no GPU. Raises InvalidInventory or
    InvalidAnnotation when the inventory cannot be trusted."""
    name = NodeName(text(path(node, "metadata").get("name")) or "")
    who = describe(node, "node")
    if not name:
        raise InvalidInventory(f"{who} has no metadata.name")
    if resource is not None:
        inventory = inventory_from_spec(name, path(resource, "spec"))
    else:
        inventory = _from_capacity(name, path(node, "status", "capacity"), who)
    if inventory is None:
        return None
    unhealthy = annotations_of(node).get(contract.GPU_UNHEALTHY_IDS, "")
    if unhealthy:
        marked = set(parse_card_indices(unhealthy, key=contract.GPU_UNHEALTHY_IDS, owner=who))
        # Indices of cards the node no longer has are stale, not harmful: ignored.
        cards = tuple(
            Card(
                index=c.index,
                memory=c.memory,
                healthy=c.healthy and c.index not in marked,
                uuid=c.uuid,
                model=c.model,
                memory_mib=c.memory_mib,
            )
            for c in inventory.cards
        )
        inventory = replace(inventory, cards=cards)
    return inventory


def _from_capacity(name: NodeName, capacity: Body, who: str) -> NodeInventory | None:
    memory = parse_quantity(
        capacity.get(contract.GPU_MEMORY, 0), resource=contract.GPU_MEMORY, owner=f"{who} capacity"
    )
    number = parse_quantity(
        capacity.get(contract.GPU_NUMBER, 0), resource=contract.GPU_NUMBER, owner=f"{who} capacity"
    )
    if number == 0:
        if memory == 0:
            return None
        raise InvalidInventory(
            f"{who} has capacity {contract.GPU_MEMORY}={memory} but {contract.GPU_NUMBER}=0, so "
            f"the memory cannot be split into cards; the device plugin must publish "
            f"{contract.GPU_NUMBER} (or a GPUNode resource)"
        )
    if memory % number:
        raise InvalidInventory(
            f"{who} has capacity {contract.GPU_MEMORY}={memory}, not divisible by "
            f"{contract.GPU_NUMBER}={number}; cards of different sizes need the gpushare "
            f"device plugin, which publishes each card in a GPUNode resource"
        )
    if number > MAX_CARDS:
        raise InvalidInventory(
            f"{who} has capacity {contract.GPU_NUMBER}={number}, more cards than a node holds "
            f"({MAX_CARDS} at most): no device plugin publishes that; correct the node's status"
        )
    # A node of Volcano's number strategy shows gpu-memory 0: whole cards only.
    per_card = memory // number
    cards = tuple(Card(index=CardIndex(i), memory=per_card, healthy=True) for i in range(number))
    return NodeInventory(node=name, cards=cards, unit_mib=1, source=InventorySource.CAPACITY)


def inventory_from_spec(name: NodeName, spec: Body) -> NodeInventory | None:
    """The cards of a GPUNode `spec` (None when it lists none); InvalidInventory when the
    spec contradicts itself. The device plugin reads its own spec through this too."""
    who = f"GPUNode {name}"
    unit = spec.get("memoryUnitMiB", 1)
    if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1:
        raise InvalidInventory(f"{who}: spec.memoryUnitMiB {unit!r} must be a whole number >= 1")
    cards: list[Card] = []
    seen_uuids: set[str] = set()
    for position, raw in enumerate(sequence(spec.get("cards"))):
        card = _card(raw, unit, f"{who} spec.cards[{position}]")
        if card.uuid in seen_uuids:
            raise InvalidInventory(
                f"{who}: card UUID {card.uuid} appears twice; each card must be listed once"
            )
        seen_uuids.add(card.uuid or "")
        cards.append(card)
    if len({c.index for c in cards}) != len(cards):
        raise InvalidInventory(f"{who}: a card index appears twice; each card must be listed once")
    if not cards:
        return None
    identifies_pods = spec.get("identifiesPods", False)
    if not isinstance(identifies_pods, bool):
        raise InvalidInventory(
            f"{who}: spec.identifiesPods {identifies_pods!r} must be true or false"
        )
    serves = spec.get("schedulerNames")
    if serves is not None and (
        not isinstance(serves, list) or not all(isinstance(n, str) and n for n in serves)
    ):
        raise InvalidInventory(f"{who}: spec.schedulerNames {serves!r} must be a list of names")
    return NodeInventory(
        node=name,
        cards=tuple(sorted(cards, key=lambda c: c.index)),
        unit_mib=unit,
        source=InventorySource.RESOURCE,
        identifies_pods=identifies_pods,
        serves=None if serves is None else frozenset(serves),
    )


def _card(raw: Body, unit: int, who: str) -> Card:
    index = raw.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1_000_000:
        raise InvalidInventory(f"{who}: index {index!r} must be a whole number >= 0")
    uuid = text(raw.get("uuid"))
    if not uuid:
        raise InvalidInventory(f"{who}: uuid is missing; the device plugin must report it")
    mib = raw.get("memoryMiB")
    if isinstance(mib, bool) or not isinstance(mib, int) or mib < 1:
        raise InvalidInventory(f"{who}: memoryMiB {mib!r} must be a whole number >= 1")
    health = raw.get("health", contract.HEALTHY)
    if health not in (contract.HEALTHY, contract.UNHEALTHY):
        raise InvalidInventory(
            f"{who}: health {health!r} must be {contract.HEALTHY!r} or {contract.UNHEALTHY!r}"
        )
    return Card(
        index=CardIndex(index),
        memory=mib // unit,
        healthy=health == contract.HEALTHY,
        uuid=uuid,
        model=text(raw.get("model")),
        memory_mib=mib,
    )

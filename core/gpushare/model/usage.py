"""Per-card GPU usage of the cluster: who holds which card, and how much is free.

The `Ledger` is rebuilt from the `volcano.sh/gpu-index` annotations of the pods that have a
node and have not finished (the annotation is the only persisted state, as in Volcano), and
is then updated incrementally as the scheduler assumes and forgets pods. It is pure and
synchronous: a decision made against it sees one consistent state.

Rules:
- A gpu-memory pod holds its total on every card its `gpu-index` names (one card when we
  placed it; Volcano's multi-card regression is counted conservatively).
- A gpu-number pod holds each named card whole: the card is exclusive, shared with no one.
- A pod asking for GPU memory or cards whose `gpu-index` is missing, malformed or names a
  card the node lacks is not lost: it is counted against the node total ("unattributed").
- Unhealthy cards keep the pods they hold but are offered to no one.
- Free memory is never negative, even when forged annotations overcommit a card.

It also keeps the indexes that make a decision cheap on large clusters: healthy shareable
cards sorted by free memory, and nodes sorted by free memory (see placement).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NewType, TypeVar

from gpushare.model import contract
from gpushare.model.annotations import CardIndex, format_card_indices, parse_card_indices
from gpushare.model.bodies import Body, annotations_of, describe, path, text
from gpushare.model.errors import GpuShareError, InvalidAnnotation
from gpushare.model.inventory import Card, NodeInventory, NodeName
from gpushare.model.request import GpuKind, PodRequest, gpu_request

PodUid = NewType("PodUid", str)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, kw_only=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: PodUid

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """A pod's hold on the GPU cards of one node."""

    pod: PodRef
    node: NodeName
    kind: GpuKind
    cards: tuple[CardIndex, ...]
    """The cards named by `gpu-index`; empty when the pod has none (unattributed)."""
    amount: int
    """MEMORY: units held on each named card. NUMBER: whole cards requested."""

    def annotations(self) -> dict[str, str]:
        """The `gpu-index` annotation that records this allocation on the pod."""
        return {contract.GPU_INDEX: format_card_indices(self.cards)}


@dataclass(frozen=True, kw_only=True, slots=True)
class PodClaim:
    """What a pod in the cluster holds, read from its manifest; `problem` says what in its
    annotations or request could not be honoured (to log), while `allocation` keeps what is
    still counted."""

    allocation: Allocation | None
    problem: str | None = None
    request: PodRequest | None = None
    """The pod's GPU request when it could be read (its signature drives the exactness rule)."""


def pod_ref(pod: Body) -> PodRef:
    meta = path(pod, "metadata")
    return PodRef(
        namespace=text(meta.get("namespace")) or "",
        name=text(meta.get("name")) or "",
        uid=PodUid(text(meta.get("uid")) or ""),
    )


def claim_of(pod: Body) -> PodClaim:
    """The GPU hold of a pod as the cluster shows it: only pods with a node that have not
    finished hold anything."""
    node = text(path(pod, "spec").get("nodeName"))
    if not node or text(path(pod, "status").get("phase")) in FINISHED_PHASES:
        return PodClaim(allocation=None)
    try:
        request = gpu_request(pod)
    except GpuShareError as error:
        # The request cannot be read, so there is nothing sound to count.
        return PodClaim(allocation=None, problem=str(error))
    if request.kind is None:
        return PodClaim(allocation=None, request=request)
    ref = pod_ref(pod)
    who = describe(pod, "pod")
    raw_index = annotations_of(pod).get(contract.GPU_INDEX)
    problem = None
    cards: tuple[CardIndex, ...] = ()
    if raw_index is None:
        problem = (
            f"{who} holds {request.kind.value} on node {node} without "
            f"{contract.GPU_INDEX}; counted against the node total only"
        )
    else:
        try:
            cards = parse_card_indices(raw_index, key=contract.GPU_INDEX, owner=who)
        except GpuShareError as error:
            problem = f"{error}; counted against the node total only"
    allocation = Allocation(
        pod=ref, node=NodeName(node), kind=request.kind, cards=cards, amount=request.total
    )
    return PodClaim(allocation=allocation, problem=problem, request=request)


def check_allocation(allocation: Allocation, inventory: NodeInventory) -> None:
    """Raise InvalidAnnotation unless `allocation` names cards `inventory` can serve: every
    card exists and is healthy, one card for a gpu-memory pod, as many as it asks for a
    gpu-number pod. The device plugin never serves an allocation that fails this."""
    who = f"pod {allocation.pod} on node {allocation.node}"
    value = format_card_indices(allocation.cards)
    if not allocation.cards:
        raise InvalidAnnotation(
            f"{who} has no valid {contract.GPU_INDEX}; it was not placed by a gpushare or "
            f"Volcano scheduler: recreate it with schedulerName set to one"
        )
    for index in allocation.cards:
        card = inventory.card(index)
        if card is None:
            raise InvalidAnnotation(
                f"{who}: {contract.GPU_INDEX}={value!r} names card {index}, which the node "
                f"does not have (cards {format_card_indices(c.index for c in inventory.cards)})"
                f"; delete the pod so that it is scheduled again"
            )
        if not card.healthy:
            raise InvalidAnnotation(
                f"{who}: {contract.GPU_INDEX}={value!r} names card {index}, which is "
                f"unhealthy; delete the pod so that it is scheduled again"
            )
    expected = 1 if allocation.kind is GpuKind.MEMORY else allocation.amount
    if len(allocation.cards) != expected:
        raise InvalidAnnotation(
            f"{who}: {contract.GPU_INDEX}={value!r} names {len(allocation.cards)} cards but "
            f"the pod's {allocation.kind.value} request needs {expected}; delete the pod so "
            f"that it is scheduled again"
        )


@dataclass(kw_only=True, slots=True)
class CardUsage:
    """Mutable bookkeeping of one card, owned by the Ledger (read, never write, from outside)."""

    card: Card
    used: int = 0
    pods: dict[PodUid, PodRef] = field(default_factory=dict)
    exclusive: int = 0
    """How many gpu-number pods hold the card (more than one only through forged annotations)."""

    @property
    def free(self) -> int:
        """Memory units still free; 0 when a whole-card pod holds it."""
        if self.exclusive:
            return 0
        return max(0, self.card.memory - self.used)

    @property
    def allocated(self) -> int:
        """Memory units counted as allocated: the whole card while a gpu-number pod holds
        it, never more than the card (forged annotations can overcommit it)."""
        return self.card.memory if self.exclusive else min(self.used, self.card.memory)

    @property
    def shareable(self) -> bool:
        """May take a gpu-memory pod: healthy and held whole by no one."""
        return self.card.healthy and not self.exclusive

    @property
    def idle(self) -> bool:
        """May be taken whole: healthy and holding no pod at all."""
        return self.card.healthy and not self.pods


@dataclass(kw_only=True, slots=True)
class NodeUsage:
    inventory: NodeInventory
    cards: dict[CardIndex, CardUsage]
    unattributed_memory: int = 0
    unattributed_cards: int = 0
    free: int = 0
    """Memory units free on shareable cards, less memory held without a card (kept current
    by the ledger, which makes every change)."""
    free_key: tuple[int, NodeName] | None = None
    """This node's entry in the ledger's node index, while it is in it."""
    revision: int = 0
    """Counts the ledger's changes to this node's cards: what a reader derived from them at
    one revision holds until the next (a node whose cards are replaced is a new object)."""

    def recount(self) -> None:
        total = sum(u.free for u in self.cards.values() if u.shareable)
        self.free = max(0, total - self.unattributed_memory)

    @property
    def idle_cards(self) -> int:
        """Cards that can be taken whole, less whole cards held without a card."""
        return max(0, sum(1 for u in self.cards.values() if u.idle) - self.unattributed_cards)


class Ledger:
    """Allocations by pod, per-card usage by node, and the placement indexes.

    A pod's allocation is stored even while its node is unknown (pods and nodes arrive from
    different watches); it is attributed to cards when the node's inventory arrives.
    """

    def __init__(self) -> None:
        self._allocations: dict[PodUid, Allocation] = {}
        self._by_node: dict[NodeName, dict[PodUid, Allocation]] = {}
        self._nodes: dict[NodeName, NodeUsage] = {}
        self._without_gpu: dict[NodeName, str | None] = {}
        # (free units, node, card) of every shareable card, ascending.
        self._cards_by_free: list[tuple[int, NodeName, CardIndex]] = []
        # (free units, node) of every GPU node, ascending.
        self._nodes_by_free: list[tuple[int, NodeName]] = []
        self._node_names: list[NodeName] = []

    # -- nodes ---------------------------------------------------------------------------

    def set_node(self, inventory: NodeInventory) -> None:
        """Add or replace a node's cards; its pods are re-attributed to the new cards."""
        name = inventory.node
        self._drop_node_indexes(name)
        self._without_gpu.pop(name, None)
        usage = NodeUsage(
            inventory=inventory, cards={c.index: CardUsage(card=c) for c in inventory.cards}
        )
        self._nodes[name] = usage
        insort(self._node_names, name)
        for allocation in self._by_node.get(name, {}).values():
            self._attribute(usage, allocation, +1)
        self._index_node(usage)

    def set_node_without_gpu(self, node: NodeName, problem: str | None = None) -> None:
        """Record a node with no usable GPU: `problem` is None when it has none, else why its
        inventory cannot be used. Diagnoses list these nodes too."""
        self._drop_node_indexes(node)
        self._nodes.pop(node, None)
        self._without_gpu[node] = problem

    def remove_node(self, node: NodeName) -> None:
        """Forget a node; its pods' allocations stay until the pods go (they may return)."""
        self._drop_node_indexes(node)
        self._nodes.pop(node, None)
        self._without_gpu.pop(node, None)

    # -- pods ----------------------------------------------------------------------------

    def add(self, allocation: Allocation) -> None:
        """Record an allocation; a pod's earlier allocation is replaced."""
        self.release(allocation.pod.uid)
        self._allocations[allocation.pod.uid] = allocation
        self._by_node.setdefault(allocation.node, {})[allocation.pod.uid] = allocation
        usage = self._nodes.get(allocation.node)
        if usage is not None:
            self._update_node(usage, allocation, +1)

    def release(self, uid: PodUid) -> Allocation | None:
        """Drop a pod's allocation, if it has one, and return it."""
        allocation = self._allocations.pop(uid, None)
        if allocation is None:
            return None
        on_node = self._by_node[allocation.node]
        del on_node[uid]
        if not on_node:
            del self._by_node[allocation.node]
        usage = self._nodes.get(allocation.node)
        if usage is not None:
            self._update_node(usage, allocation, -1)
        return allocation

    # -- reading -------------------------------------------------------------------------

    def allocation(self, uid: PodUid) -> Allocation | None:
        return self._allocations.get(uid)

    def allocations(self) -> Iterator[Allocation]:
        return iter(self._allocations.values())

    def node(self, node: NodeName) -> NodeUsage | None:
        return self._nodes.get(node)

    def nodes(self) -> Mapping[NodeName, NodeUsage]:
        return self._nodes

    def nodes_without_gpu(self) -> Mapping[NodeName, str | None]:
        """Nodes without usable GPUs: None when they have none, else why not."""
        return self._without_gpu

    def node_names(self) -> list[NodeName]:
        """GPU nodes in name order (firstfit's order)."""
        return self._node_names

    def cards_from(self, free: int) -> Iterator[tuple[int, NodeName, CardIndex]]:
        """Shareable cards with at least `free` units free, tightest first."""
        table = self._cards_by_free
        for position in range(bisect_left(table, (free,)), len(table)):
            yield table[position]

    def nodes_from(self, free: int) -> Iterator[tuple[int, NodeName]]:
        """GPU nodes with at least `free` units free, fullest first."""
        table = self._nodes_by_free
        for position in range(bisect_left(table, (free,)), len(table)):
            yield table[position]

    def nodes_descending(self) -> Iterator[tuple[int, NodeName]]:
        """GPU nodes, most free first; nodes with equal free memory in name order."""
        table = self._nodes_by_free
        end = len(table)
        while end:
            start = bisect_left(table, (table[end - 1][0],))
            for position in range(start, end):  # no slice copy: blocks can be large
                yield table[position]
            end = start

    # -- bookkeeping ---------------------------------------------------------------------

    def _update_node(self, usage: NodeUsage, allocation: Allocation, sign: int) -> None:
        """Apply one allocation, re-indexing only the cards it names and the node."""
        name = usage.inventory.node
        touched = [usage.cards[i] for i in allocation.cards if i in usage.cards]
        for card in touched:
            if card.shareable:
                _remove(self._cards_by_free, (card.free, name, card.card.index))
        if usage.free_key is not None:
            _remove(self._nodes_by_free, usage.free_key)
        self._attribute(usage, allocation, sign)
        usage.recount()
        usage.revision += 1
        for card in touched:
            if card.shareable:
                insort(self._cards_by_free, (card.free, name, card.card.index))
        usage.free_key = (usage.free, name)
        insort(self._nodes_by_free, usage.free_key)

    @staticmethod
    def _attribute(usage: NodeUsage, allocation: Allocation, sign: int) -> None:
        missing = 0
        for index in allocation.cards:
            card = usage.cards.get(index)
            if card is None:
                missing += 1
                continue
            if sign > 0:
                card.pods[allocation.pod.uid] = allocation.pod
            else:
                card.pods.pop(allocation.pod.uid, None)
            if allocation.kind is GpuKind.MEMORY:
                card.used += sign * allocation.amount
            else:
                card.exclusive += sign
        if allocation.kind is GpuKind.MEMORY:
            if missing or not allocation.cards:
                usage.unattributed_memory += sign * allocation.amount
        else:
            unnamed = max(0, allocation.amount - len(allocation.cards)) + missing
            usage.unattributed_cards += sign * unnamed

    def _index_node(self, usage: NodeUsage) -> None:
        name = usage.inventory.node
        usage.recount()
        for index, card in usage.cards.items():
            if card.shareable:
                insort(self._cards_by_free, (card.free, name, index))
        usage.free_key = (usage.free, name)
        insort(self._nodes_by_free, usage.free_key)

    def _unindex_node(self, usage: NodeUsage) -> None:
        name = usage.inventory.node
        for index, card in usage.cards.items():
            if card.shareable:
                _remove(self._cards_by_free, (card.free, name, index))
        if usage.free_key is not None:
            _remove(self._nodes_by_free, usage.free_key)
            usage.free_key = None

    def _drop_node_indexes(self, node: NodeName) -> None:
        usage = self._nodes.get(node)
        if usage is not None:
            self._unindex_node(usage)
            position = bisect_left(self._node_names, node)
            del self._node_names[position]


_Key = TypeVar("_Key", tuple[int, NodeName], tuple[int, NodeName, CardIndex])


def _remove(table: list[_Key], key: _Key) -> None:
    position = bisect_left(table, key)
    if position == len(table) or table[position] != key:
        raise AssertionError(f"ledger index lost {key!r}")  # a bookkeeping bug, never input
    del table[position]

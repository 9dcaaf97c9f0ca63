"""Choosing a node and card(s) for a pod: the placement policy lives here and only here.

Policies (the configuration names):
- ``bestfit`` (default): the card, cluster-wide, left with the least free memory after the
  pod is placed; whole cards from the node with the fewest idle cards, smallest cards first.
- ``firstfit``: Volcano's rule: nodes in name order, the lowest card index that fits.
- ``binpack``: the fullest node that fits, then its tightest card.
- ``spread``: the emptiest node, then its emptiest card.
Ties break on node name, then card index, so every decision is deterministic.

Each policy walks the ledger's indexes in its order of preference and stops at the first
card that fits, so a decision touches a few entries, not every card of a large cluster; the
result is the same as scoring every card. Filters outside the GPU model (readiness, taints,
cpu...) come in as a `NodeCheck`, asked lazily and at most once per node and decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gpushare.model.annotations import CardIndex
from gpushare.model.diagnosis import Diagnosis, diagnose
from gpushare.model.errors import InvalidRequest
from gpushare.model.inventory import NodeName
from gpushare.model.request import GpuKind, PodRequest
from gpushare.model.usage import Allocation, CardUsage, Ledger, NodeUsage, PodRef

NodeCheck = Callable[[NodeName], str | None]
"""Verdict of the non-GPU filters on a node: None when it passes, else why not."""
CardCheck = Callable[[NodeName, CardIndex], str | None]
"""Verdict on one card beyond its free memory (the scheduler's exactness rule): None or why
the pod may not have it now."""


class Policy(StrEnum):
    BESTFIT = "bestfit"
    FIRSTFIT = "firstfit"
    BINPACK = "binpack"
    SPREAD = "spread"


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    node: NodeName
    cards: tuple[CardIndex, ...]
    kind: GpuKind
    amount: int
    """MEMORY: units taken on the card. NUMBER: whole cards taken."""
    free_after: int
    """MEMORY: units left free on the card. NUMBER: idle cards left on the node."""
    unit_mib: int = 1
    """MiB per memory unit on that node."""

    def allocation(self, pod: PodRef) -> Allocation:
        return Allocation(
            pod=pod, node=self.node, kind=self.kind, cards=self.cards, amount=self.amount
        )


def unit_check(ledger: Ledger, unit_mib: int | None, check: NodeCheck | None) -> NodeCheck:
    """`check`, and for a pod whose gpu-memory limits were converted to `unit_mib` MiB per
    device, that the node's device plugin runs that unit (its kubelet hands out devices of
    the node's unit, so any other would give the pod the wrong memory)."""
    nodes = ledger.nodes()

    def checked(node: NodeName) -> str | None:
        usage = nodes.get(node) if unit_mib is not None else None
        if usage is not None and usage.inventory.unit_mib != unit_mib:
            return (
                f"node runs {usage.inventory.unit_mib} MiB per {GpuKind.MEMORY.value} device, "
                f"the pod's limits are in {unit_mib} MiB units (GPUShareConfig "
                f"spec.memoryUnitMiB): drain the node's GPU pods and run its device plugin "
                f"with GPU_MEMORY_FACTOR={unit_mib}"
            )
        return None if check is None else check(node)

    return checked


def served_check(ledger: Ledger, scheduler_name: str | None, check: NodeCheck | None) -> NodeCheck:
    """`check`, and that the node's device plugin serves pods of `scheduler_name`: it refuses
    the Allocate of any other, and the kubelet then fails the pod."""
    nodes = ledger.nodes()

    def checked(node: NodeName) -> str | None:
        usage = nodes.get(node)
        serves = usage.inventory.serves if usage is not None else None
        if serves is not None and scheduler_name not in serves:
            return (
                f"its device plugin serves pods of schedulerName {', '.join(sorted(serves))}, not "
                f"{scheduler_name} (add {scheduler_name} to the plugin's GPUSHARE_SCHEDULER_NAMES, "
                f"or to Helm's schedulerNames, which sets the operator's and the plugins')"
            )
        return None if check is None else check(node)

    return checked


class _Checker:
    """A NodeCheck asked at most once per node within one decision, and the CardCheck."""

    def __init__(self, check: NodeCheck | None, card_check: CardCheck | None) -> None:
        self._check = check
        self._card_check = card_check
        self._verdicts: dict[NodeName, str | None] = {}

    def card_reason(self, node: NodeName, card: CardIndex) -> str | None:
        return None if self._card_check is None else self._card_check(node, card)

    def card_ok(self, node: NodeName, card: CardIndex) -> bool:
        return self.card_reason(node, card) is None

    def reason(self, node: NodeName) -> str | None:
        if self._check is None:
            return None
        if node not in self._verdicts:
            self._verdicts[node] = self._check(node)
        return self._verdicts[node]

    def passes(self, node: NodeName) -> bool:
        return self.reason(node) is None


def place(
    ledger: Ledger,
    request: PodRequest,
    policy: Policy = Policy.BESTFIT,
    *,
    node_check: NodeCheck | None = None,
    card_check: CardCheck | None = None,
    unit_mib: int | None = None,
) -> Placement | Diagnosis:
    """Where `request` goes under `policy`, or a Diagnosis of every node and card if nowhere.
    `unit_mib`: the unit a gpu-memory pod's limits were converted to (`unit_check`)."""
    checker = _Checker(unit_check(ledger, unit_mib, node_check), card_check)
    found = _find(ledger, request, policy, checker)
    if found is not None:
        return found
    return diagnose(ledger, request, checker.reason, checker.card_reason)


def find_placement(
    ledger: Ledger,
    request: PodRequest,
    policy: Policy = Policy.BESTFIT,
    *,
    node_check: NodeCheck | None = None,
    card_check: CardCheck | None = None,
    unit_mib: int | None = None,
) -> Placement | None:
    """`place` without the diagnosis: None when nothing fits (a cheap answer to "would it
    fit?", since a diagnosis visits every card of the cluster)."""
    checker = _Checker(unit_check(ledger, unit_mib, node_check), card_check)
    return _find(ledger, request, policy, checker)


def _find(
    ledger: Ledger, request: PodRequest, policy: Policy, checker: _Checker
) -> Placement | None:
    if request.kind is GpuKind.MEMORY:
        return _MEMORY_POLICIES[policy](ledger, request.total, checker)
    if request.kind is GpuKind.NUMBER:
        return _whole_cards(ledger, request.total, policy, checker)
    raise InvalidRequest("placement is for pods that ask for a GPU; this one asks for none")


# -- gpu-memory: one card ------------------------------------------------------------------


def _shared(node: NodeUsage, card: CardUsage, need: int) -> Placement:
    return Placement(
        node=node.inventory.node,
        cards=(card.card.index,),
        kind=GpuKind.MEMORY,
        amount=need,
        free_after=card.free - need,
        unit_mib=node.inventory.unit_mib,
    )


def _fitting(node: NodeUsage, need: int, checker: _Checker) -> list[CardUsage]:
    """Cards of `node` that can take `need` units, by index (only if the node total allows)."""
    if node.free < need:
        return []
    name = node.inventory.node
    return [
        card
        for index, card in sorted(node.cards.items())
        if card.shareable and card.free >= need and checker.card_ok(name, index)
    ]


def _bestfit(ledger: Ledger, need: int, checker: _Checker) -> Placement | None:
    for _, name, index in ledger.cards_from(need):
        node = ledger.nodes()[name]
        if node.free >= need and checker.passes(name) and checker.card_ok(name, index):
            return _shared(node, node.cards[index], need)
    return None


def _firstfit(ledger: Ledger, need: int, checker: _Checker) -> Placement | None:
    for name in ledger.node_names():
        node = ledger.nodes()[name]
        cards = _fitting(node, need, checker)
        if cards and checker.passes(name):
            return _shared(node, cards[0], need)
    return None


def _binpack(ledger: Ledger, need: int, checker: _Checker) -> Placement | None:
    for _, name in ledger.nodes_from(need):
        node = ledger.nodes()[name]
        cards = _fitting(node, need, checker)
        if cards and checker.passes(name):
            return _shared(node, min(cards, key=lambda c: c.free), need)
    return None


def _spread(ledger: Ledger, need: int, checker: _Checker) -> Placement | None:
    for free, name in ledger.nodes_descending():
        if free < need:
            break
        node = ledger.nodes()[name]
        cards = _fitting(node, need, checker)
        if cards and checker.passes(name):
            return _shared(node, max(cards, key=lambda c: (c.free, -c.card.index)), need)
    return None


_MEMORY_POLICIES: dict[Policy, Callable[[Ledger, int, _Checker], Placement | None]] = {
    Policy.BESTFIT: _bestfit,
    Policy.FIRSTFIT: _firstfit,
    Policy.BINPACK: _binpack,
    Policy.SPREAD: _spread,
}


# -- gpu-number: whole cards ---------------------------------------------------------------


def _whole_cards(ledger: Ledger, count: int, policy: Policy, checker: _Checker) -> Placement | None:
    def preference(node: NodeUsage) -> tuple[int, NodeName]:
        name = node.inventory.node
        if policy is Policy.BESTFIT:
            return node.idle_cards, name
        if policy is Policy.BINPACK:
            return node.free, name
        if policy is Policy.SPREAD:
            return -node.idle_cards, name
        return 0, name

    candidates = sorted(
        (n for n in ledger.nodes().values() if n.idle_cards >= count), key=preference
    )
    for node in candidates:
        name = node.inventory.node
        if not checker.passes(name):
            continue
        idle = [c for i, c in node.cards.items() if c.idle and checker.card_ok(name, i)]
        if len(idle) - node.unattributed_cards < count:
            continue
        if policy in (Policy.BESTFIT, Policy.BINPACK):
            # Smallest cards first: the large ones stay for large requests.
            idle.sort(key=lambda c: (c.card.memory, c.card.index))
        else:
            idle.sort(key=lambda c: c.card.index)
        chosen = tuple(sorted(c.card.index for c in idle[:count]))
        return Placement(
            node=node.inventory.node,
            cards=chosen,
            kind=GpuKind.NUMBER,
            amount=count,
            free_after=node.idle_cards - count,
        )
    return None

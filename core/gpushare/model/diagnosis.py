"""Why a pod fits nowhere: a verdict for every node and card, and one message for people.

`summary()` reads like kube-scheduler's FitError ("0/N nodes are available: ..." with a
histogram of reasons) followed by per-node, per-card detail, closest nodes first, capped at
1,024 characters. The operator's FailedScheduling event, the PodScheduled condition and the
CLI's `explain` all render this same object.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gpushare.model.annotations import CardIndex
from gpushare.model.inventory import NodeName
from gpushare.model.request import GpuKind, PodRequest
from gpushare.model.usage import CardUsage, Ledger, NodeUsage

MAX_MESSAGE = 1024


class CardProblem(StrEnum):
    UNHEALTHY = "unhealthy"
    HELD_WHOLE = "held whole by a gpu-number pod"
    IN_USE = "in use"
    TOO_LITTLE_MEMORY = "too little free memory"
    RESERVED = "reserved"


class NodeProblem(StrEnum):
    NO_GPU = "no GPU"
    INVALID_INVENTORY = "unusable GPU inventory"
    FILTERED = "filtered"
    NO_CARD_FITS = "no card with enough free GPU memory"
    NODE_TOTAL = "GPU memory held by pods without a card"
    TOO_FEW_IDLE_CARDS = "too few idle cards"


@dataclass(frozen=True, kw_only=True, slots=True)
class CardVerdict:
    card: CardIndex
    problem: CardProblem
    free: int = 0
    need: int = 0
    unit_mib: int = 1
    detail: str = ""
    """RESERVED: why the card is held back for now."""

    def __str__(self) -> str:
        if self.problem is CardProblem.RESERVED:
            return f"card {self.card} {self.detail}"
        if self.problem is CardProblem.TOO_LITTLE_MEMORY:
            return (
                f"card {self.card} {format_amount(self.free, self.unit_mib)} free < "
                f"{format_amount(self.need, self.unit_mib)}"
            )
        return f"card {self.card} {self.problem.value}"


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeVerdict:
    node: NodeName
    problem: NodeProblem
    detail: str = ""
    """FILTERED: the filter's reason; INVALID_INVENTORY: the error; else a short note."""
    cards: tuple[CardVerdict, ...] = ()
    closeness: int = 0
    """Largest free memory on a usable card (or idle cards): closest nodes are shown first."""

    @property
    def label(self) -> str:
        """The histogram bucket: the same for nodes that fail the same way."""
        if self.problem is NodeProblem.FILTERED:
            return self.detail
        return self.problem.value

    def __str__(self) -> str:
        if self.cards:
            cards = ", ".join(_grouped(self.cards))
            return f"{self.node}: {cards}" + (f" ({self.detail})" if self.detail else "")
        return f"{self.node}: {self.detail or self.problem.value}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnosis:
    request: PodRequest
    nodes: tuple[NodeVerdict, ...]
    """Closest first: GPU misses by closeness, then filtered nodes, then nodes without GPU."""

    def summary(self, limit: int = MAX_MESSAGE) -> str:
        counts = Counter(verdict.label for verdict in self.nodes)
        histogram = ", ".join(
            f"{n} {label}"
            for label, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        )
        head = f"0/{len(self.nodes)} nodes are available"
        head += f": {histogram}." if histogram else "."
        return _truncate(head, [str(verdict) for verdict in self.nodes], limit)


def diagnose(
    ledger: Ledger,
    request: PodRequest,
    node_check: Callable[[NodeName], str | None],
    card_check: Callable[[NodeName, CardIndex], str | None] = lambda node, card: None,
) -> Diagnosis:
    """A verdict for every node known to `ledger` (GPU nodes and nodes without one)."""
    verdicts: list[NodeVerdict] = []
    for name, usage in ledger.nodes().items():
        reason = node_check(name)
        if reason is not None:
            verdicts.append(NodeVerdict(node=name, problem=NodeProblem.FILTERED, detail=reason))
        elif request.kind is GpuKind.NUMBER:
            verdicts.append(_whole_card_verdict(usage, request.total, card_check))
        else:
            verdicts.append(_memory_verdict(usage, request.total, card_check))
    for name, problem in ledger.nodes_without_gpu().items():
        if problem is None:
            verdicts.append(NodeVerdict(node=name, problem=NodeProblem.NO_GPU))
        else:
            verdicts.append(
                NodeVerdict(node=name, problem=NodeProblem.INVALID_INVENTORY, detail=problem)
            )
    rank = {NodeProblem.FILTERED: 1, NodeProblem.INVALID_INVENTORY: 2, NodeProblem.NO_GPU: 3}
    verdicts.sort(key=lambda v: (rank.get(v.problem, 0), -v.closeness, v.node))
    return Diagnosis(request=request, nodes=tuple(verdicts))


def _memory_verdict(
    usage: NodeUsage, need: int, card_check: Callable[[NodeName, CardIndex], str | None]
) -> NodeVerdict:
    unit = usage.inventory.unit_mib
    name = usage.inventory.node
    cards: list[CardVerdict] = []
    for index, card in sorted(usage.cards.items()):
        problem = _card_problem(card)
        if problem is None and card.free < need:
            problem = CardProblem.TOO_LITTLE_MEMORY
        reserved = card_check(name, index) if problem is None else None
        if reserved is not None:
            cards.append(CardVerdict(card=index, problem=CardProblem.RESERVED, detail=reserved))
        elif problem is not None:
            cards.append(
                CardVerdict(card=index, problem=problem, free=card.free, need=need, unit_mib=unit)
            )
    closeness = max((c.free for c in usage.cards.values() if c.shareable), default=0)
    if len(cards) < len(usage.cards):
        # A card fits, but memory held by pods without a card leaves the node short.
        detail = (
            f"{format_amount(usage.free, unit)} free on the node after "
            f"{format_amount(usage.unattributed_memory, unit)} held by pods without "
            f"a valid gpu-index < {format_amount(need, unit)}"
        )
        return NodeVerdict(
            node=name, problem=NodeProblem.NODE_TOTAL, detail=detail, closeness=closeness
        )
    return NodeVerdict(
        node=name, problem=NodeProblem.NO_CARD_FITS, cards=tuple(cards), closeness=closeness
    )


def _whole_card_verdict(
    usage: NodeUsage, need: int, card_check: Callable[[NodeName, CardIndex], str | None]
) -> NodeVerdict:
    cards: list[CardVerdict] = []
    for index, card in sorted(usage.cards.items()):
        problem = _card_problem(card) or (CardProblem.IN_USE if card.pods else None)
        reserved = card_check(usage.inventory.node, index) if problem is None else None
        if reserved is not None:
            cards.append(CardVerdict(card=index, problem=CardProblem.RESERVED, detail=reserved))
        elif problem is not None:
            cards.append(CardVerdict(card=index, problem=problem))
    detail = f"{usage.idle_cards} idle < {need} cards"
    return NodeVerdict(
        node=usage.inventory.node,
        problem=NodeProblem.TOO_FEW_IDLE_CARDS,
        detail=detail,
        cards=tuple(cards),
        closeness=usage.idle_cards,
    )


def _card_problem(card: CardUsage) -> CardProblem | None:
    if not card.card.healthy:
        return CardProblem.UNHEALTHY
    if card.exclusive:
        return CardProblem.HELD_WHOLE
    return None


def _grouped(cards: tuple[CardVerdict, ...]) -> list[str]:
    """Card verdicts, with runs of consecutive cards in the same state written once:
    ``cards 1-7 11178 MiB free < 20000 MiB``."""
    runs: list[list[CardVerdict]] = []
    for card in cards:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and card.card == last.card + 1
            and (card.problem, card.free) == (last.problem, last.free)
        ):
            runs[-1].append(card)
        else:
            runs.append([card])
    shown = []
    for run in runs:
        text = str(run[0])
        if len(run) > 1:
            text = text.replace(f"card {run[0].card}", f"cards {run[0].card}-{run[-1].card}", 1)
        shown.append(text)
    return shown


def format_amount(units: int, unit_mib: int) -> str:
    """Memory units as people read them: MiB, with the units when one is not 1 MiB."""
    if unit_mib == 1:
        return f"{units} MiB"
    return f"{units * unit_mib} MiB ({units} x {unit_mib} MiB)"


def _truncate(head: str, details: list[str], limit: int) -> str:
    """`head` and as many `details` as fit in `limit`, then how many were left out."""
    message = head
    for shown, detail in enumerate(details):
        piece = (" " if shown == 0 else "; ") + detail
        left_after = len(details) - shown - 1
        reserve = len(f"; and {left_after} more nodes") if left_after else 0
        if len(message) + len(piece) + reserve > limit:
            return (message + f"; and {len(details) - shown} more nodes")[:limit]
        message += piece
    return message[:limit]

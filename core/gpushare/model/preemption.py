"""Card-aware preemption: which pods of lower priority to evict so that a pending pod fits,
and where it then goes.

A gpu-memory pod needs room on one card; a gpu-number pod needs whole cards of one node.
Only pods of strictly lower priority are candidates, and of the sets of them that make
room, the cheapest is chosen, in this order (`Cost`):
1. the fewest disruptions past PodDisruptionBudgets (`disruption.breach`), as kube-scheduler
   orders its candidates first: a budget is honoured whenever some set makes room without
   breaking one, and breaking one is a last resort (a tenant's budget cannot keep its pods
   of low priority from every pod of higher priority);
2. the fewest pods evicted;
3. the lowest priority among them (the highest one, as low as can be);
4. the lowest sum of their priorities;
5. the least work lost: the sum of how long they have run (the youngest go first).
Ties go to the node first by name, then the lowest card index.

A set is eligible only if
- it breaks no PodDisruptionBudget, where the view says so (`View.break_budgets` False:
  defragmentation, which moves pods only as their budgets allow);
- a gang member's eviction that takes its gang below its `minMember` counts as the whole
  gang's (all its bound members are then in the set, each of lower priority, or the set is
  not eligible);
- the node passes the pod's other filters once the set is gone (`NodeCheckWithout`).

The search is exact up to `MAX_SETS` sets per card (or per node, for whole cards); a card
with more candidate sets than that (many small pods) is searched in that many, the largest
pods first.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from gpushare.model.annotations import CardIndex
from gpushare.model.disruption import Budget, breach
from gpushare.model.inventory import NodeName
from gpushare.model.placement import CardCheck, Placement
from gpushare.model.request import GpuKind, PodRequest
from gpushare.model.usage import Ledger, NodeUsage, PodRef, PodUid

MAX_SETS = 4096
NO_ROOM = "no card would take it with pods of lower priority gone"

NodeCheckWithout = Callable[[NodeName, frozenset[PodUid]], str | None]
"""The pod's non-GPU filters on a node once the given pods are gone: None, or why not."""
SetCheck = Callable[[Placement, frozenset[PodUid]], str | None]
"""A last word on an eligible set and where it puts the pod (defragmentation: whether the
pods it moves fit elsewhere): None, or why not."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Evictable:
    """A bound pod that holds a card, as preemption weighs it."""

    ref: PodRef
    priority: int
    started_s: float
    """When it started (or was created): the work lost is counted from here."""
    labels: Mapping[str, str] = field(default_factory=dict)
    gang: Hashable | None = None
    """The gang (PodGroup) it belongs to, if any (`View.gangs`)."""
    movable: bool = False
    """A controller owns it: evicted, it comes back (defragmentation moves only these)."""


class Evictables(Mapping[PodUid, Evictable]):
    """The evictable pods, also ranked as single victims, cheapest first: lowest priority,
    then youngest, then by node and card, the order `preempt` tries them in before any set
    of several pods (one pod always costs less than two). Kept current by its owner (the
    operator's cache), so a decision does not sort 50,000 pods."""

    def __init__(self) -> None:
        self._pods: dict[PodUid, Evictable] = {}
        self._keys: dict[PodUid, tuple[int, float, str, int, str]] = {}
        self._ranked: list[tuple[int, float, str, int, str]] = []

    @classmethod
    def of(cls, pods: Iterable[tuple[Evictable, NodeName, CardIndex]]) -> Evictables:
        """A table of `pods` (each with its node and first card), ranked in one sort."""
        table = cls()
        for pod, node, card in pods:
            key = (pod.priority, -pod.started_s, node, card, pod.ref.uid)
            table._pods[pod.ref.uid] = pod
            table._keys[pod.ref.uid] = key
        table._ranked = sorted(table._keys.values())
        return table

    def put(self, pod: Evictable, node: NodeName, card: CardIndex) -> None:
        self.discard(pod.ref.uid)
        key = (pod.priority, -pod.started_s, node, card, pod.ref.uid)
        self._pods[pod.ref.uid] = pod
        self._keys[pod.ref.uid] = key
        insort(self._ranked, key)

    def discard(self, uid: PodUid) -> None:
        key = self._keys.pop(uid, None)
        if key is not None:
            del self._pods[uid]
            del self._ranked[bisect_left(self._ranked, key)]

    def ranked(self) -> Iterator[PodUid]:
        return (PodUid(key[-1]) for key in self._ranked)

    def __getitem__(self, uid: PodUid) -> Evictable:
        return self._pods[uid]

    def __iter__(self) -> Iterator[PodUid]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)


@dataclass(frozen=True, kw_only=True, slots=True)
class GangHold:
    """The bound members of a gang and how many of them may go before it is below its
    `minMember`."""

    members: frozenset[PodUid]
    spare: int


@dataclass(frozen=True, kw_only=True, slots=True)
class View:
    """What preemption reads beside the ledger."""

    pods: Mapping[PodUid, Evictable]
    """The bound pods that may be evicted at all (not terminating); a pod of the ledger
    missing here is never a victim."""
    gangs: Mapping[Hashable, GangHold] = field(default_factory=dict)
    budgets: Sequence[Budget] = ()
    now_s: float = 0.0
    whole_gangs: bool = True
    """A set that takes a gang below its minimum takes the whole gang (preemption); False:
    such a set is not eligible (defragmentation never breaks a gang)."""
    break_budgets: bool = True
    """A set that breaks a PodDisruptionBudget is eligible, at its cost (preemption); False:
    it is not (defragmentation)."""

    def without(self, gone: frozenset[PodUid]) -> View:
        """The view once `gone` have left, for the next choice of one plan (a gang's next
        member, defragmentation's next pod): each budget allows as many fewer of its pods to
        go (never fewer than none: taking more is past it), and each gang holds them no more,
        its spare used by as many."""
        pods = [self.pods[uid] for uid in gone if uid in self.pods]
        budgets = tuple(
            replace(
                budget,
                allowed=max(
                    0,
                    budget.allowed
                    - sum(1 for p in pods if budget.covers(p.ref.namespace, p.labels)),
                ),
            )
            for budget in self.budgets
        )
        gangs = {
            key: GangHold(
                members=hold.members - gone, spare=max(0, hold.spare - len(hold.members & gone))
            )
            for key, hold in self.gangs.items()
            if hold.members - gone
        }
        return replace(self, budgets=budgets, gangs=gangs)


@dataclass(frozen=True, order=True, slots=True)
class Cost:
    past_budgets: int
    """Disruptions beyond what the victims' PodDisruptionBudgets allow."""
    pods: int
    highest_priority: int
    priority_sum: int
    work_lost_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Preemption:
    placement: Placement
    """Where the pod goes once the victims are gone."""
    victims: tuple[PodRef, ...]
    cost: Cost
    past_budgets: tuple[PodRef, ...] = ()
    """The victims a breached PodDisruptionBudget covers: deleted, not evicted (the Eviction
    API would refuse them), as kube-scheduler deletes its victims."""
    budgets: tuple[Budget, ...] = ()
    """The budgets breached."""


def preempt(
    ledger: Ledger,
    request: PodRequest,
    priority: int,
    view: View,
    *,
    node_check: NodeCheckWithout,
    card_check: CardCheck | None = None,
    set_check: SetCheck | None = None,
) -> Preemption | str:
    """The cheapest preemption that lets a pod of `priority` with `request` fit, or why
    there is none."""
    search = _Search(ledger, priority, view, node_check, card_check, set_check=set_check)
    if request.kind is GpuKind.MEMORY:
        if search.single_victim(request.total):
            return search.best or search.why_not()
        for node in ledger.nodes().values():
            for index in sorted(node.cards):
                search.memory_card(node, index, request.total)
    elif request.kind is GpuKind.NUMBER:
        for node in ledger.nodes().values():
            search.whole_cards(node, request.total)
    else:
        return "a pod that asks for no GPU does not preempt for one"
    if search.best is None:
        return search.why_not()
    return search.best


def cost_of(victims: Iterable[PodUid], view: View) -> Cost:
    """What evicting `victims` costs, by the order above."""
    pods = [view.pods[uid] for uid in victims]
    return _cost(pods, view, breach(view.budgets, ((p.ref.namespace, p.labels) for p in pods)).over)


def _cost(pods: Sequence[Evictable], view: View, past_budgets: int) -> Cost:
    priorities = [p.priority for p in pods]
    return Cost(
        past_budgets=past_budgets,
        pods=len(pods),
        highest_priority=max(priorities, default=0),
        priority_sum=sum(priorities),
        work_lost_s=sum(max(0.0, view.now_s - p.started_s) for p in pods),
    )


def with_gangs(chosen: Iterable[PodUid], view: View, priority: int) -> frozenset[PodUid] | None:
    """`chosen` and, for each gang it would take below its minimum, all of that gang's
    bound members; None when one of those may not be evicted by a pod of `priority`."""
    victims = set(chosen)
    done: set[Hashable] = set()
    pending = [view.pods[uid].gang for uid in victims]
    while pending:
        key = pending.pop()
        hold = view.gangs.get(key) if key is not None else None
        if hold is None or key in done or len(victims & hold.members) <= hold.spare:
            continue
        if not view.whole_gangs:
            return None
        done.add(key)
        for uid in hold.members - victims:
            member = view.pods.get(uid)
            if member is None or member.priority >= priority:
                return None
            victims.add(uid)
            pending.append(member.gang)
    return frozenset(victims)


class _Search:
    def __init__(
        self,
        ledger: Ledger,
        priority: int,
        view: View,
        node_check: NodeCheckWithout,
        card_check: CardCheck | None,
        *,
        set_check: SetCheck | None = None,
    ) -> None:
        self._ledger = ledger
        self._priority = priority
        self._view = view
        self._node_check = node_check
        self._card_check = card_check
        self._set_check = set_check
        self.best: Preemption | None = None
        self._key: tuple[Cost, NodeName, tuple[CardIndex, ...]] | None = None
        self._reasons: dict[str, None] = {}  # why eligible sets were refused, in order

    def _evictable(self, uid: PodUid) -> bool:
        pod = self._view.pods.get(uid)
        return pod is not None and pod.priority < self._priority

    def _beaten(self, pods: int) -> bool:
        """No set of `pods` or more pods can beat the best so far (one that breaks no
        budget: a larger set that breaks none beats one that does)."""
        return self._settled() and self.best is not None and pods > self.best.cost.pods

    def _settled(self) -> bool:
        """The best so far breaks no budget: only fewer pods, or cheaper ones, beat it."""
        return self.best is not None and self.best.cost.past_budgets == 0

    def single_victim(self, need: int) -> bool:
        """The cheapest one pod whose going makes room, trying the pods in rank order
        (`Evictables`): the first that does and breaks no budget is the answer; False when
        none does (the best that breaks one, if any, kept for the whole search to beat)."""
        pods = self._view.pods
        ranked = pods.ranked() if isinstance(pods, Evictables) else self._rank()
        for uid in ranked:
            pod = pods[uid]
            if pod.priority >= self._priority:
                return False  # ranked by priority: none after it may go either
            allocation = self._ledger.allocation(uid)
            node = self._ledger.node(allocation.node) if allocation is not None else None
            if (
                allocation is None
                or node is None
                or len(with_gangs([uid], self._view, self._priority) or ()) != 1
            ):
                continue  # its going takes its gang's others too: not a single victim
            for index in sorted(allocation.cards):
                if self._room_without(node, index, uid, need):
                    self._consider(node, (index,), [uid], GpuKind.MEMORY, need)
                    if self._settled():
                        return True
        return False

    def _rank(self) -> list[PodUid]:
        """`Evictables.ranked` for a plain table (tests, the CLI's small views)."""

        def key(uid: PodUid) -> tuple[int, float, str, int, str]:
            pod = self._view.pods[uid]
            allocation = self._ledger.allocation(uid)
            node, card = (
                ("", 0)
                if allocation is None
                else (allocation.node, min(allocation.cards, default=0))
            )
            return pod.priority, -pod.started_s, node, card, uid

        return sorted(self._view.pods, key=key)

    def _room_without(self, node: NodeUsage, index: CardIndex, uid: PodUid, need: int) -> bool:
        """Whether card `index` of `node`, which does not take the pod now, would once `uid`
        alone is gone."""
        usage = node.cards.get(index)
        if usage is None or not usage.card.healthy or usage.card.memory < need:
            return False
        if usage.shareable and usage.free >= need:
            return False
        if self._card_check is not None and self._card_check(node.inventory.node, index):
            return False
        used = 0
        for other in usage.pods:
            allocation = self._ledger.allocation(other)
            if other == uid or allocation is None:
                continue
            if allocation.kind is GpuKind.NUMBER:
                return False
            used += allocation.amount
        return usage.card.memory - used >= need

    def memory_card(self, node: NodeUsage, index: CardIndex, need: int) -> None:
        usage = node.cards[index]
        if not usage.card.healthy or usage.card.memory < need:
            return
        if usage.shareable and usage.free >= need:
            return  # it fits there now: what keeps the pod off is not the card's pods
        if self._card_check is not None and self._card_check(node.inventory.node, index):
            return
        holders = self._holders(usage.pods)
        if holders is None:
            return
        whole, shared, kept = holders
        room = usage.card.memory - kept
        if room < need:
            return
        unheld = room - sum(amount for amount, _ in shared)
        cut_short = len(shared) >= MAX_SETS.bit_length()  # more than MAX_SETS subsets
        if cut_short and self._view.break_budgets and self._view.budgets:
            # Try first without the pods that a budget allows none of to go, so that a set
            # every budget allows is not missed for sets that break one (`Cost.past_budgets`
            # comes first).
            unprotected = [(amount, uid) for amount, uid in shared if not self._unbudgeable(uid)]
            if len(unprotected) < len(shared):
                self._card_sets(node, index, need, whole=whole, shared=unprotected, free=unheld)
                if self._settled():
                    return
        self._card_sets(node, index, need, whole=whole, shared=shared, free=unheld)

    def _card_sets(
        self,
        node: NodeUsage,
        index: CardIndex,
        need: int,
        *,
        whole: list[PodUid],
        shared: list[tuple[int, PodUid]],
        free: int,
    ) -> None:
        """The sets of `shared` (largest first) that make `need` on a card with `free` once
        `whole` is gone, fewest pods first, up to `MAX_SETS`."""
        deficit = need - free
        least = 0
        while deficit > sum(amount for amount, _ in shared[:least]):
            least += 1
            if least > len(shared):
                return
        sets = (
            subset
            for size in range(least, len(shared) + 1)
            for subset in combinations(shared, size)
        )
        for tried, subset in enumerate(sets):
            if tried >= MAX_SETS or self._beaten(len(whole) + len(subset)):
                return
            if sum(amount for amount, _ in subset) >= deficit:
                chosen = [*whole, *(uid for _, uid in subset)]
                self._consider(node, (index,), chosen, GpuKind.MEMORY, need)

    def _unbudgeable(self, uid: PodUid) -> bool:
        """A budget that covers the pod allows none of its pods to go."""
        pod = self._view.pods[uid]
        return any(
            budget.allowed <= 0 and budget.covers(pod.ref.namespace, pod.labels)
            for budget in self._view.budgets
        )

    def _holders(
        self, pods: Iterable[PodUid]
    ) -> tuple[list[PodUid], list[tuple[int, PodUid]], int] | None:
        """A card's pods: the gpu-number ones (all must go), the gpu-memory ones that may
        go (largest first) and the units of those that may not; None when a gpu-number pod
        that may not go holds it."""
        whole: list[PodUid] = []
        shared: list[tuple[int, PodUid]] = []
        kept = 0
        for uid in pods:
            allocation = self._ledger.allocation(uid)
            if allocation is None:
                continue
            if allocation.kind is GpuKind.NUMBER:
                if not self._evictable(uid):
                    return None
                whole.append(uid)
            elif self._evictable(uid):
                shared.append((allocation.amount, uid))
            else:
                kept += allocation.amount
        shared.sort(key=lambda item: (-item[0], item[1]))
        return whole, shared, kept

    def whole_cards(self, node: NodeUsage, count: int) -> None:
        name = node.inventory.node
        if node.unattributed_cards or node.idle_cards >= count:
            return  # cards held without a card named, or it fits there now
        usable: list[tuple[CardIndex, frozenset[PodUid]]] = []
        for index in sorted(node.cards):
            usage = node.cards[index]
            if not usage.card.healthy:
                continue
            if self._card_check is not None and self._card_check(name, index) is not None:
                continue
            if all(self._evictable(uid) for uid in usage.pods):
                usable.append((index, frozenset(usage.pods)))
        if count > len(usable):
            return  # also: `combinations` allocates `count` indexes first (huge: MemoryError)
        for tried, chosen in enumerate(combinations(usable, count)):
            if tried >= MAX_SETS:
                return
            victims = frozenset[PodUid]().union(*(pods for _, pods in chosen))
            if not self._beaten(len(victims)):
                cards = tuple(index for index, _ in chosen)
                self._consider(node, cards, victims, GpuKind.NUMBER, count)

    def _consider(
        self,
        node: NodeUsage,
        cards: tuple[CardIndex, ...],
        chosen: Iterable[PodUid],
        kind: GpuKind,
        amount: int,
    ) -> None:
        name = node.inventory.node
        victims = with_gangs(chosen, self._view, self._priority)
        if victims is None:
            self._reasons.setdefault(
                "the pods that would make room include members of a gang of equal or higher "
                "priority, whose minimum they would break"
                if self._view.whole_gangs
                else "the pods that would make room include members of a gang that would fall "
                "below its minMember"
            )
            return
        pods = [self._view.pods[uid] for uid in victims]
        # What it costs with no budget broken is a lower bound: the budgets need not be read
        # for a set that cannot beat the best so far.
        lower = _cost(pods, self._view, 0)
        if self._key is not None and (lower, name, cards) >= self._key:
            return
        broken = breach(self._view.budgets, ((p.ref.namespace, p.labels) for p in pods))
        if broken.budgets and not self._view.break_budgets:
            self._reasons.setdefault(
                "the pods that would make room are protected by PodDisruptionBudget "
                f"{broken.budgets[0]}"
            )
            return
        cost = replace(lower, past_budgets=broken.over)
        key = (cost, name, cards)
        if self._key is not None and key >= self._key:
            return
        reason = self._node_check(name, victims)
        if reason is not None:
            self._reasons.setdefault(f"node {name} would still refuse it: {reason}")
            return
        placement = self._placement(node, cards, kind, amount, victims)
        if self._set_check is not None and (reason := self._set_check(placement, victims)):
            self._reasons.setdefault(reason)
            return
        self._key = key
        self.best = Preemption(
            placement=placement,
            victims=_in_order(p.ref for p in pods),
            cost=cost,
            past_budgets=_in_order(pods[i].ref for i in broken.pods),
            budgets=broken.budgets,
        )

    def _placement(
        self,
        node: NodeUsage,
        cards: tuple[CardIndex, ...],
        kind: GpuKind,
        amount: int,
        victims: frozenset[PodUid],
    ) -> Placement:
        """Where the pod goes once `victims` are gone, with what is then left free."""
        if kind is GpuKind.NUMBER:
            idle = sum(
                1 for u in node.cards.values() if u.card.healthy and u.pods.keys() <= victims
            )
            free_after = idle - amount
        else:
            usage = node.cards[cards[0]]
            used = 0
            for uid in usage.pods:
                allocation = self._ledger.allocation(uid)
                if uid not in victims and allocation is not None:
                    used += allocation.amount
            free_after = usage.card.memory - used - amount
        return Placement(
            node=node.inventory.node,
            cards=cards,
            kind=kind,
            amount=amount,
            free_after=free_after,
            unit_mib=node.inventory.unit_mib,
        )

    def why_not(self) -> str:
        if self._reasons:
            return "; ".join(self._reasons)
        return NO_ROOM


def _in_order(refs: Iterable[PodRef]) -> tuple[PodRef, ...]:
    return tuple(sorted(refs, key=lambda r: (r.namespace, r.name)))

"""Defragmentation plans against brute force on small clusters: only movable pods move, no
budget is breached, every pod of the plan lands on a card with room, the pending pods it
places fit once the moves are done, and a single pending pod is placed with the fewest moves
any set of moves allows."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.model import (
    Allocation,
    Card,
    CardIndex,
    GpuKind,
    Ledger,
    NodeInventory,
    NodeName,
    PodRef,
    PodRequest,
    PodUid,
    find_placement,
)
from gpushare.model.defrag import DefragPlan, PendingPod, plan_defrag
from gpushare.model.disruption import Budget, breach
from gpushare.model.inventory import InventorySource
from gpushare.model.preemption import Evictable, GangHold, View

NOW = 10_000.0


@dataclass(frozen=True)
class Fragmented:
    ledger: Ledger
    movable: View
    pending: list[PendingPod]


def anywhere(_node: NodeName, _gone: frozenset[PodUid]) -> str | None:
    return None


@st.composite
def fragmented(draw: st.DrawFn) -> Fragmented:
    ledger = Ledger()
    pods: dict[PodUid, Evictable] = {}
    serial = 0
    for n in range(draw(st.integers(1, 2))):
        name = NodeName(f"node-{n}")
        count = draw(st.integers(1, 4))
        cards = tuple(Card(index=CardIndex(i), memory=10, healthy=True) for i in range(count))
        ledger.set_node(
            NodeInventory(node=name, cards=cards, unit_mib=1, source=InventorySource.RESOURCE)
        )
        for card in cards:
            used = 0
            for amount in draw(st.lists(st.integers(1, 4), min_size=1, max_size=6)):
                if used + amount > card.memory:
                    break
                used += amount
                serial += 1
                uid = PodUid(f"uid-{serial:03d}")
                ref = PodRef(namespace="a", name=f"p{serial}", uid=uid)
                ledger.add(
                    Allocation(
                        pod=ref, node=name, kind=GpuKind.MEMORY, cards=(card.index,), amount=amount
                    )
                )
                if draw(st.booleans()):  # a controller owns it
                    pods[uid] = Evictable(
                        ref=ref,
                        priority=draw(st.integers(0, 3)),
                        started_s=NOW - draw(st.integers(0, 5)) * 100,
                        labels={"app": draw(st.sampled_from(["x", "y"]))},
                        gang=draw(st.sampled_from([None, None, "g"])),
                    )
    gangs: dict[Hashable, GangHold] = {}
    members = frozenset(uid for uid, pod in pods.items() if pod.gang == "g")
    if members:
        gangs["g"] = GangHold(members=members, spare=draw(st.integers(0, len(members))))
    budgets = [
        Budget(
            namespace="a",
            name="pdb",
            match_labels={"app": draw(st.sampled_from(["x", "y"]))},
            allowed=draw(st.integers(0, 2)),
        )
        for _ in range(draw(st.integers(0, 1)))
    ]
    # Mostly larger than any hole: it fits only if pods move.
    largest_hole = max(c.free for n in ledger.nodes().values() for c in n.cards.values())
    pending = [
        PendingPod(
            ref=PodRef(namespace="a", name=f"pending-{i}", uid=PodUid(f"pending-{i}")),
            request=PodRequest(
                kind=GpuKind.MEMORY,
                total=draw(st.integers(min(10, largest_hole + draw(st.integers(0, 1))), 10)),
                containers=(),
            ),
            node_check=anywhere,
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    view = View(pods=pods, gangs=gangs, budgets=budgets, now_s=NOW)
    return Fragmented(ledger, view, pending)


def apply(ledger: Ledger, plan: DefragPlan, requests: dict[PodUid, PodRequest]) -> None:
    """Carry the plan out on the ledger, checking each step lands on a card with room."""
    for room in plan.rooms:
        for move in room.moves:
            assert ledger.release(move.pod.uid) is not None
        for move in room.moves:
            card = ledger.nodes()[move.to.node].cards[move.to.cards[0]]
            assert card.free >= move.units, move
            replacement = PodRef(
                namespace=move.pod.namespace, name=move.pod.name, uid=PodUid(f"new-{move.pod.uid}")
            )
            ledger.add(move.to.allocation(replacement))
        placement = room.placement
        card = ledger.nodes()[placement.node].cards[placement.cards[0]]
        assert card.free >= requests[room.pod.uid].total, room
        ledger.add(placement.allocation(room.pod))


@settings(max_examples=300, deadline=None)
@given(fragmented())
def test_a_plan_moves_only_movable_pods_within_their_budgets_and_places_what_it_says(
    case: Fragmented,
) -> None:
    before = {a.pod.uid: a for a in case.ledger.allocations()}
    plan = plan_defrag(case.ledger, case.pending, case.movable)
    assert {a.pod.uid: a for a in case.ledger.allocations()} == before  # left as found
    moved = [move.pod.uid for move in plan.moves]
    assert len(moved) == len(set(moved))  # each pod moves once
    assert all(uid in case.movable.pods for uid in moved)
    movers = [case.movable.pods[uid] for uid in moved]
    assert not breach(case.movable.budgets, ((p.ref.namespace, p.labels) for p in movers)).budgets
    for key, hold in case.movable.gangs.items():
        assert len(hold.members & set(moved)) <= hold.spare, key
    assert {room.pod for room in plan.rooms} | {ref for ref, _ in plan.waiting} == {
        p.ref for p in case.pending
    }
    apply(case.ledger, plan, {p.ref.uid: p.request for p in case.pending})


def fewest_moves(case: Fragmented, pod: PendingPod) -> int | None:
    """Brute force: the fewest movable pods of one card whose moving lets `pod` fit there,
    each moved pod fitting on another card afterwards, largest first, as best-fit puts it."""
    if find_placement(case.ledger, pod.request) is not None:
        return 0
    best = None
    for name, node in case.ledger.nodes().items():
        for index, usage in node.cards.items():
            candidates = sorted(uid for uid in usage.pods if uid in case.movable.pods)
            for size in range(len(candidates) + 1):
                for chosen in combinations(candidates, size):
                    if best is not None and size >= best:
                        continue
                    if feasible(case, pod, name, index, chosen):
                        best = size
    return best


def feasible(
    case: Fragmented, pod: PendingPod, node: NodeName, index: CardIndex, chosen: tuple[PodUid, ...]
) -> bool:
    movers = [case.movable.pods[uid] for uid in chosen]
    if breach(case.movable.budgets, ((p.ref.namespace, p.labels) for p in movers)).budgets:
        return False
    for hold in case.movable.gangs.values():
        if len(hold.members & set(chosen)) > hold.spare:
            return False
    ledger = case.ledger
    released = [ledger.release(uid) for uid in chosen]
    added: list[PodUid] = []
    try:
        card = ledger.nodes()[node].cards[index]
        if card.free < pod.request.total:
            return False
        ledger.add(
            Allocation(
                pod=pod.ref,
                node=node,
                kind=GpuKind.MEMORY,
                cards=(index,),
                amount=pod.request.total,
            )
        )
        added.append(pod.ref.uid)
        for allocation in sorted(
            (a for a in released if a), key=lambda a: (-a.amount, a.pod.namespace, a.pod.name)
        ):
            to = find_placement(
                ledger,
                PodRequest(kind=GpuKind.MEMORY, total=allocation.amount, containers=()),
                card_check=lambda n, c: "target" if (n, c) == (node, index) else None,
            )
            if to is None:
                return False
            uid = PodUid(f"new-{allocation.pod.uid}")
            ledger.add(to.allocation(PodRef(namespace="a", name=uid, uid=uid)))
            added.append(uid)
        return True
    finally:
        for uid in added:
            ledger.release(uid)
        for back in released:
            if back is not None:
                ledger.add(back)


@settings(max_examples=300, deadline=None)
@given(fragmented())
def test_one_pending_pod_is_placed_with_the_fewest_moves(case: Fragmented) -> None:
    pod = case.pending[0]
    plan = plan_defrag(case.ledger, [pod], case.movable)
    fewest = fewest_moves(case, pod)
    if fewest is None:
        assert not plan.rooms
        assert plan.waiting
        return
    (room,) = plan.rooms
    assert len(room.moves) == fewest

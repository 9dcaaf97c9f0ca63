"""Defragmentation on the cache, pure: the plan for the pods waiting now
(`gpushare.model.defrag.plan_defrag`), as the `gpushare defrag` CLI prints and applies it and
the operator reports (`defragmentation: Plan`) or carries out (`Auto`).

The pending pods are the scheduler's own (its scheduler names, not gated, gpu-memory, not a
gang's member: a gang is placed whole or not at all), in the queue's order: priority, then
age. The pods that may move are those a controller owns (`Evictable.movable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpushare.model import CardIndex, GpuKind, NodeCheck, NodeName, Placement, PodUid
from gpushare.model.defrag import DefragPlan, PendingPod, plan_defrag
from gpushare.model.placement import Policy, find_placement
from gpushare.model.preemption import NodeCheckWithout
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import Demand, PodInfo
from gpushare_operator.scheduling.preemption import gang_holds, node_check_for


def waiting_pods(cache: SchedulerCache, book: GangBook) -> list[PodInfo]:
    """The pods a plan is made for, in the queue's order."""
    found = []
    for uid in cache.pending_uids():
        pod = cache.pending(uid)
        if pod is None or pod.gated or pod.group is not None:
            continue
        if isinstance(pod.demand, Demand) and pod.demand.request.kind is GpuKind.MEMORY:
            found.append(pod)
    return sorted(found, key=lambda p: (-book.priority_of(p), p.created_s or 0.0, p.ref.name))


def defrag_plan(
    cache: SchedulerCache,
    book: GangBook,
    policy: Policy,
    *,
    moved_check: Callable[[PodUid], NodeCheck | None] = lambda _uid: None,
) -> DefragPlan:
    """The fewest moves after which the waiting pods fit."""
    pending = []
    for pod in waiting_pods(cache, book):
        assert isinstance(pod.demand, Demand)  # waiting_pods keeps only these
        if cache.nomination(pod.uid) is not None:
            continue  # it waits for a card being freed, reserved there: counted as placed
        pending.append(
            PendingPod(
                ref=pod.ref,
                request=pod.demand.request,
                node_check=node_check_for(cache, pod.demand),
            )
        )
    view = cache.preemption_view(gang_holds(cache, book))
    movable = replace(view, pods={uid: p for uid, p in view.pods.items() if p.movable})
    return plan_defrag(cache.ledger, pending, movable, policy=policy, moved_check=moved_check)


def claim_freed(
    cache: SchedulerCache, book: GangBook, node: NodeName, card: CardIndex, policy: Policy
) -> tuple[PodInfo, Placement] | None:
    """The waiting pod (in the queue's order) that fits no card now but would fit `card` of
    `node` once the pods terminating there are gone, and its place there; None if none."""
    usage = cache.ledger.node(node)
    leaving = cache.leaving(node, card)
    if usage is None or not leaving or not usage.cards[card].card.healthy:
        return None
    held = 0
    for uid in usage.cards[card].pods:
        allocation = cache.ledger.allocation(uid)
        if uid in leaving or allocation is None:
            continue
        if allocation.kind is GpuKind.NUMBER:
            return None  # held whole by a pod that stays
        held += allocation.amount
    room = usage.cards[card].card.memory - held
    for pod in waiting_pods(cache, book):
        assert isinstance(pod.demand, Demand)  # waiting_pods keeps only these
        need = pod.demand.request.total
        if need > room or cache.nomination(pod.uid) is not None:
            continue
        check = node_check_for(cache, pod.demand)
        if check(node, leaving) is not None:
            continue
        if find_placement(cache.ledger, pod.demand.request, policy, node_check=_now(check)):
            continue  # it fits somewhere now: the scheduler places it
        placement = Placement(
            node=node,
            cards=(card,),
            kind=GpuKind.MEMORY,
            amount=need,
            free_after=room - need,
            unit_mib=usage.inventory.unit_mib,
        )
        return pod, placement
    return None


def _now(check: NodeCheckWithout) -> NodeCheck:
    """`check` with every pod where it is."""

    def now(node: NodeName) -> str | None:
        return check(node, frozenset())

    return now

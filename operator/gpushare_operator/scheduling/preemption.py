"""Making room for a pod that fits no card: the preemption decision on the cache, pure.

The scheduler calls `make_room` when `plan` refuses a pod, and acts on what it returns (the
evictions, the Events, `status.nominatedNodeName`); the `gpushare` CLI calls the same
function on a cache built from one LIST, so `explain` and `simulate` say what the operator
would evict. The victims are chosen by the model (`gpushare.model.preemption`); here the
cache's state is put in its terms, and a pod that already preempted waits for its victims
instead of choosing others.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from gpushare.model import CardIndex, NodeName, PodRef, PodUid, format_card_indices
from gpushare.model.gangs import GroupSpec, held_min_member
from gpushare.model.placement import Policy, served_check, unit_check
from gpushare.model.preemption import (
    Cost,
    GangHold,
    NodeCheckWithout,
    Preemption,
    View,
    preempt,
)
from gpushare.model.usage import Allocation
from gpushare_operator.scheduling.cache import Nomination, SchedulerCache
from gpushare_operator.scheduling.decision import Plan, Refusal, plan
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import Demand, PodInfo

NOMINATION_TTL_S = 300.0
"""How long a nominated pod waits for its victims to go (their grace periods run meanwhile)
before it chooses again among the pods that are not terminating."""
NO_COST = Cost(past_budgets=0, pods=0, highest_priority=0, priority_sum=0, work_lost_s=0.0)
WAIT_RETRY_S = 5.0
"""How often a nominated pod is tried again while its victims leave (each one's deletion
wakes it too)."""


@dataclass(frozen=True, slots=True)
class Room:
    """A preemption to carry out: evict `preemption.victims`, then bind the pod there."""

    preemption: Preemption
    refusal: Refusal
    """What to report on the pod meanwhile (its placement reserved, its node nominated)."""


def gang_holds(cache: SchedulerCache, book: GangBook) -> dict[Hashable, GangHold]:
    """Each gang's bound members that hold cards (not terminating: the ones preemption may
    take) and how many of all its bound members may go before it is below the minMember its
    members were bound under (`gangs.held_min_member`). A member without a card is never a
    victim: were it among the members to take with the gang, no set could take the gang."""
    holds: dict[Hashable, GangHold] = {}
    for spec in book.specs():
        if not spec.is_gang:
            continue
        bound = [
            pod for pod in book.members(spec.key) if cache.holds(pod.uid) and not pod.terminating
        ]
        if not bound:
            continue
        said = [under for pod in bound if (under := _bound_under(cache, spec, pod)) is not None]
        least = held_min_member(spec.min_member, said)
        holds[spec.key] = GangHold(
            members=frozenset(pod.uid for pod in bound if cache.cards_of(pod.uid) is not None),
            spare=max(0, len(bound) - least),
        )
    return holds


def _bound_under(cache: SchedulerCache, spec: GroupSpec, pod: PodInfo) -> int | None:
    """The minMember a bound member was bound under, by gpushare's record; None where nothing
    says (a pod no guard keeps: without a GPU, or another scheduler's)."""
    if pod.bound_gang_min is not None:
        return pod.bound_gang_min
    if (pod.guarded and pod.carries_gang_min) or pod.in_default_gang:
        # A record that cannot be read says the least; Volcano's default gang, with
        # minMember 1, may be joined after the bind.
        return 1
    if pod.guarded and cache.is_ours(pod):
        return spec.min_member  # bound before gpushare wrote the record: as before
    return None


def make_room(
    cache: SchedulerCache,
    book: GangBook,
    pod: PodInfo,
    refusal: Refusal,
    *,
    priority: int,
    may_preempt: bool = True,
) -> Room | Refusal:
    """What to do for `pod`, which `refusal` keeps off every card: wait for the pods it is
    nominated to replace (its victims, or the pods defragmentation moves for it), preempt
    (`Room`; not with `may_preempt` False), or report why it cannot (the refusal, extended)."""
    nomination = cache.nomination(pod.uid)
    if nomination is not None:
        waiting = _still_waiting(cache, nomination)
        if waiting is not None:
            return waiting
        cache.drop_nomination(pod.uid)
    if not may_preempt:
        return refusal
    demand = pod.demand
    if not isinstance(demand, Demand) or demand.request.kind is None:
        return refusal
    if not pod.preempts:
        return _extended(refusal, "its preemptionPolicy is Never")
    found = _cheapest(cache, cache.preemption_view(gang_holds(cache, book)), pod, demand, priority)
    if isinstance(found, str):
        return _extended(refusal, found)
    return _room(refusal, found)


def _cheapest(
    cache: SchedulerCache, view: View, pod: PodInfo, demand: Demand, priority: int
) -> Preemption | str:
    """The model's choice of victims for `pod`, on the cache's ledger as it is now."""
    return preempt(
        cache.ledger,
        demand.request,
        priority,
        view,
        node_check=node_check_for(cache, demand),
        card_check=cache.card_check(demand.request, pod.ref.namespace),
    )


def _room(refusal: Refusal, preemption: Preemption) -> Room:
    where = _where(preemption.placement.node, preemption.placement.cards)
    done = (
        f"preempting {len(preemption.victims)} pod(s) of lower priority on {where}"
        if preemption.victims
        else f"nominated to {where}"
    )
    return Room(
        preemption,
        Refusal(
            f"{refusal.message}; {done}: bound there once they are gone",
            WAIT_RETRY_S,
            waits_for=preemption.placement,
            nominated=preemption.placement.node,
        ),
    )


def make_room_for_gang(
    cache: SchedulerCache,
    book: GangBook,
    spec: GroupSpec,
    refused: list[tuple[PodInfo, Refusal]],
    *,
    priority: int,
    policy: Policy,
) -> list[tuple[PodInfo, Room | Refusal]]:
    """What to do for a gang that cannot be placed whole (`refused`: its pending members,
    each with the gang's refusal): wait for the victims its members already preempted,
    preempt for as many members as it needs to reach `minMember` (all their victims, or
    none), or keep the refusals. Members that fit without evicting anyone are nominated too,
    so that the gang is bound together once the victims are gone."""
    nominated = [
        (pod, nomination)
        for pod, _ in refused
        if (nomination := cache.nomination(pod.uid)) is not None
    ]
    waiting = [
        (pod, still)
        for pod, nomination in nominated
        if (still := _still_waiting(cache, nomination)) is not None
    ]
    if waiting:
        # The members nominated where they fit keep those cards meanwhile: else a newcomer
        # takes one, and the gang preempts again once its victims are gone.
        held = {pod.uid for pod, _ in waiting}
        keeping = {
            pod.uid: kept
            for pod, nomination in nominated
            if pod.uid not in held and (kept := _kept(cache, nomination)) is not None
        }
        return [
            *waiting,
            *((pod, keeping.get(pod.uid, r)) for pod, r in refused if pod.uid not in held),
        ]
    for pod, _ in refused:
        cache.drop_nomination(pod.uid)
    needed = spec.min_member - book.counts(spec.key, cache).bound
    found, why = _gang_rooms(cache, book, refused, needed=needed, priority=priority, policy=policy)
    if found is None:
        return [(pod, _extended(refusal, why)) for pod, refusal in refused]
    rooms = {pod.uid: room for pod, room in found}
    return [(pod, rooms.get(pod.uid, refusal)) for pod, refusal in refused]


def _gang_rooms(
    cache: SchedulerCache,
    book: GangBook,
    refused: list[tuple[PodInfo, Refusal]],
    *,
    needed: int,
    priority: int,
    policy: Policy,
) -> tuple[list[tuple[PodInfo, Room]] | None, str]:
    """Members one by one, each placed where it fits or where preemption makes room, on the
    ledger as the ones before leave it (their victims gone, their places taken), the budgets
    and gangs as their victims leave them (so that the members' victims together are what
    the budgets are weighed against); the ledger is put back before returning."""
    view = cache.preemption_view(gang_holds(cache, book))
    released: list[Allocation] = []
    reserved: list[PodUid] = []  # each member where it goes, its cpu and host ports too
    found: list[tuple[PodInfo, Room]] = []
    why = "too few of its members would fit with pods of lower priority gone"
    try:
        for pod, refusal in refused:
            if len(found) == needed:
                break
            demand = pod.demand
            if not isinstance(demand, Demand) or demand.request.kind is None:
                continue
            preemption = _fits(cache, pod, demand, policy) or _cheapest(
                cache, view, pod, demand, priority
            )
            if isinstance(preemption, str):
                why = preemption
                continue
            view = view.without(frozenset(ref.uid for ref in preemption.victims))
            for ref in preemption.victims:
                if (allocation := cache.ledger.release(ref.uid)) is not None:
                    released.append(allocation)
            cache.reserve(pod, preemption.placement)
            reserved.append(pod.uid)
            found.append((pod, _room(refusal, preemption)))
    finally:
        for uid in reserved:
            cache.unreserve(uid)
        for allocation in released:
            cache.ledger.add(allocation)
    return (found if len(found) >= needed else None), why


def _fits(cache: SchedulerCache, pod: PodInfo, demand: Demand, policy: Policy) -> Preemption | None:
    """A member that fits now, as a preemption of no one."""
    decided = plan(cache, pod, policy)
    if isinstance(decided, Plan) and decided.placement is not None:
        return Preemption(placement=decided.placement, victims=(), cost=NO_COST)
    return None


def nominate(cache: SchedulerCache, pod: PodInfo, room: Room) -> None:
    """Record that `pod` preempted: its card is reserved for it as it parks."""
    victims = frozenset(ref.uid for ref in room.preemption.victims)
    cache.nominate(pod.uid, room.preemption.placement, victims)


def victim_message(preemptor: PodRef, priority: int, room: Room, victim: PodRef) -> str:
    """The `Preempted` Event's message on a victim. A preemptor of another namespace is named
    by its UID, as kube-scheduler names it: a tenant learns no other namespace's pod names."""
    who = str(preemptor) if preemptor.namespace == victim.namespace else f"pod {preemptor.uid}"
    placement = room.preemption.placement
    message = (
        f"Preempted by {who} (priority {priority}) on {_where(placement.node, placement.cards)}"
    )
    if victim not in room.preemption.past_budgets:
        return message
    # A budget covers only pods of its own namespace: the victim's, which its tenant may read.
    budgets = ", ".join(str(b) for b in room.preemption.budgets if b.namespace == victim.namespace)
    return (
        f"{message}; deleted past PodDisruptionBudget {budgets}: no set of pods of lower "
        "priority that the budgets allow made room"
    )


def preemptor_message(preemptor: PodRef, room: Room) -> str:
    """The `Preempting` Event's message on the preemptor: its victims of the same namespace
    by name, the others counted."""
    own = [ref.name for ref in room.preemption.victims if ref.namespace == preemptor.namespace]
    others = len(room.preemption.victims) - len(own)
    named = ", ".join(own)
    if others:
        named += f"{', ' if own else ''}{others} pod(s) of other namespaces"
    placement = room.preemption.placement
    past = len(room.preemption.past_budgets)
    deleted = f"; {past} of them deleted past their PodDisruptionBudgets" if past else ""
    return (
        f"Evicting {len(room.preemption.victims)} pod(s) of lower priority from "
        f"{_where(placement.node, placement.cards)} to make room: {named}{deleted}"
    )


def _still_waiting(cache: SchedulerCache, nomination: Nomination) -> Refusal | None:
    left = cache.victims_left(nomination)
    if not left or cache.clock() - nomination.since > NOMINATION_TTL_S:
        return None
    return _held(nomination, f"waiting for {left} preempted pod(s) to leave {{where}}")


def _kept(cache: SchedulerCache, nomination: Nomination) -> Refusal | None:
    """A gang member's place, nominated with no victims of its own, while its gang waits."""
    if cache.victims_left(nomination) or cache.clock() - nomination.since > NOMINATION_TTL_S:
        return None
    return _held(nomination, "waiting on {where} for its gang's preempted pods to leave")


def _held(nomination: Nomination, message: str) -> Refusal:
    """A quiet wait on the nominated card(s), reserved meanwhile; `{where}` in `message`
    names them."""
    where = _where(nomination.placement.node, nomination.placement.cards)
    return Refusal(
        message.format(where=where),
        WAIT_RETRY_S,
        quiet=True,
        waits_for=nomination.placement,
        nominated=nomination.placement.node,
    )


def node_check_for(cache: SchedulerCache, demand: Demand) -> NodeCheckWithout:
    """The pod's filters on a node once some pods are gone: its memory unit, and the rest."""
    units = unit_check(
        cache.ledger, demand.unit_mib, served_check(cache.ledger, demand.scheduler_name, None)
    )
    without = cache.node_check_without(demand.needs, demand.volumes)

    def check(node: NodeName, gone: frozenset[PodUid]) -> str | None:
        return units(node) or without(node, gone)

    return check


def _extended(refusal: Refusal, why: str) -> Refusal:
    return Refusal(
        f"{refusal.message}; no preemption: {why}",
        refusal.retry_in_s,
        refusal.wake_key,
    )


def _where(node: NodeName, cards: tuple[CardIndex, ...]) -> str:
    return f"node {node} card {format_card_indices(cards)}"

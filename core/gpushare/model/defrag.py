"""Defragmentation: the fewest pods to move so that pending pods fit, when the free memory
they need is there but scattered over cards in holes too small for any of them.

A move is an eviction of a pod that a controller recreates (a Deployment's, a Job's): its
replacement, with the same request, is placed again by the scheduler. A plan is made pod by
pending pod, in the order given (the queue's: priority, then age), on the ledger as the moves
before it leave it:
- a pod that fits now is placed as the scheduler would place it, and moves nothing;
- else the card is chosen as preemption chooses (`preempt`): the fewest moves, then the least
  work lost (the youngest pods move first), then by node and card; only movable pods
  (`View.pods`: controller-owned, gpu-memory, not terminating) count, every
  PodDisruptionBudget is honoured, no gang goes below its minimum, and a set is taken only if
  each pod it moves fits on another card afterwards (where best-fit would place its
  replacement), never back on the card being made whole.
A pending pod no plan helps is listed with the reason. The ledger is left as it was found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gpushare.model.annotations import CardIndex
from gpushare.model.inventory import NodeName
from gpushare.model.placement import NodeCheck, Placement, Policy, find_placement
from gpushare.model.preemption import (
    NO_ROOM,
    Evictables,
    NodeCheckWithout,
    Preemption,
    View,
    preempt,
)
from gpushare.model.request import GpuKind, PodRequest
from gpushare.model.usage import Allocation, Ledger, PodRef, PodUid


class Defragmentation(StrEnum):
    """What the operator does with the plan on its own (its live setting)."""

    OFF = "Off"
    PLAN = "Plan"
    """Tell it: an Event on each waiting pod it would place, and metrics."""
    AUTO = "Auto"
    """Carry it out, one waiting pod's moves per interval."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingPod:
    ref: PodRef
    request: PodRequest
    node_check: NodeCheckWithout
    """Its non-GPU filters on a node once the given pods are gone."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    pod: PodRef
    node: NodeName
    card: CardIndex
    units: int
    """What it holds on the card, in the node's memory units."""
    unit_mib: int
    to: Placement
    """Where its replacement would go."""

    @property
    def mib(self) -> int:
        return self.units * self.unit_mib


@dataclass(frozen=True, kw_only=True, slots=True)
class Room:
    """A pending pod's place in the plan: where it goes and what moves first."""

    pod: PodRef
    placement: Placement
    moves: tuple[Move, ...]
    free_before_mib: int
    """What its card has free now."""
    freed_mib: int
    """What its card has free once the moves are done (before the pod takes its share)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DefragPlan:
    rooms: tuple[Room, ...]
    """The pending pods the plan places, in order; those with moves need them first."""
    waiting: tuple[tuple[PodRef, str], ...]
    """The pending pods it cannot place, and why."""

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(move for room in self.rooms for move in room.moves)


MovedCheck = Callable[[PodUid], NodeCheck | None]
"""The non-GPU filters a moved pod's replacement must pass on a node (its own selectors and
tolerations), by the moved pod's uid."""


def plan_defrag(
    ledger: Ledger,
    pending: Sequence[PendingPod],
    movable: View,
    *,
    policy: Policy = Policy.BESTFIT,
    moved_check: MovedCheck = lambda _uid: None,
) -> DefragPlan:
    """The fewest moves after which the `pending` pods fit (see the module's doc)."""
    planner = _Planner(ledger, movable, policy, moved_check)
    try:
        for pod in pending:
            planner.plan(pod)
    finally:
        planner.undo()
    return DefragPlan(rooms=tuple(planner.rooms), waiting=tuple(planner.waiting))


class _Planner:
    def __init__(
        self, ledger: Ledger, movable: View, policy: Policy, moved_check: MovedCheck
    ) -> None:
        self._ledger = ledger
        # Moving is not evicting: every movable pod may move for any pending pod. Ranked once
        # (`Evictables`), so that each pending pod's search does not sort them again.
        placed = []
        for uid, pod in movable.pods.items():
            allocation = ledger.allocation(uid)
            if allocation is not None and allocation.cards:
                placed.append((replace(pod, priority=0), allocation.node, min(allocation.cards)))
        self._movable = Evictables.of(placed)
        self._view = replace(movable, pods=self._movable, whole_gangs=False, break_budgets=False)
        self._policy = policy
        self._moved_check = moved_check
        self._done: list[tuple[str, Allocation]] = []  # ("add" | "release", allocation)
        self.rooms: list[Room] = []
        self.waiting: list[tuple[PodRef, str]] = []

    def plan(self, pod: PendingPod) -> None:
        if pod.request.kind is not GpuKind.MEMORY:
            self.waiting.append((pod.ref, "only gpu-memory pods are planned for"))
            return
        fits = find_placement(
            self._ledger,
            pod.request,
            self._policy,
            node_check=lambda node: pod.node_check(node, frozenset()),
        )
        if fits is not None:
            self._add(fits.allocation(pod.ref))
            free = self._free_mib(fits) + fits.amount * fits.unit_mib
            self.rooms.append(
                Room(pod=pod.ref, placement=fits, moves=(), free_before_mib=free, freed_mib=free)
            )
            return
        found = preempt(
            self._ledger,
            pod.request,
            1,
            self._view,
            node_check=pod.node_check,
            set_check=lambda placement, moved: self._trial(pod, placement, moved),
        )
        if isinstance(found, str):
            if found == NO_ROOM:
                found = "no card would take it with the pods that may move moved elsewhere"
            self.waiting.append((pod.ref, found))
            return
        self._take(pod, found)

    def _trial(self, pod: PendingPod, placement: Placement, moved: frozenset[PodUid]) -> str | None:
        """Whether every pod of `moved` fits elsewhere once `pod` takes `placement`."""
        mark = len(self._done)
        try:
            self._moves(pod, placement, moved)
        except _NoRoom as error:
            return str(error)
        finally:
            self._undo_to(mark)
        return None

    def _take(self, pod: PendingPod, found: Preemption) -> None:
        free_before = self._free_mib(found.placement)
        moved = frozenset(ref.uid for ref in found.victims)
        moves = self._moves(pod, found.placement, moved)
        # The budgets and the gangs' spares count every move of the plan: what one pod's moves
        # use up, the next's may not take again.
        self._view = self._view.without(moved)
        # Moved pods are replaced by new ones: not movable again in this plan.
        for uid in moved:
            self._movable.discard(uid)
        self.rooms.append(
            Room(
                pod=pod.ref,
                placement=found.placement,
                moves=moves,
                free_before_mib=free_before,
                freed_mib=(found.placement.free_after + found.placement.amount)
                * found.placement.unit_mib,
            )
        )

    def _moves(
        self, pod: PendingPod, placement: Placement, moved: frozenset[PodUid]
    ) -> tuple[Move, ...]:
        """Move `moved` (largest first) and place `pod`, on the ledger; _NoRoom if a moved pod
        fits nowhere else."""
        target = (placement.node, placement.cards[0])
        leaving = []
        for uid in moved:
            allocation = self._ledger.allocation(uid)
            if allocation is not None:
                self._release(allocation)
                leaving.append(allocation)
        self._add(placement.allocation(pod.ref))
        moves = []
        for allocation in sorted(leaving, key=lambda a: (-a.amount, a.pod.namespace, a.pod.name)):
            request = PodRequest(kind=GpuKind.MEMORY, total=allocation.amount, containers=())
            to = find_placement(
                self._ledger,
                request,
                self._policy,
                node_check=self._moved_check(allocation.pod.uid),
                card_check=lambda node, card: (
                    "the card being made whole" if (node, card) == target else None
                ),
            )
            if to is None:
                raise _NoRoom(f"pod {allocation.pod} would have to move, and fits on no other card")
            replacement = PodRef(
                namespace=allocation.pod.namespace,
                name=allocation.pod.name,
                uid=PodUid(f"replacement-of-{allocation.pod.uid}"),
            )
            self._add(to.allocation(replacement))
            node = self._ledger.node(allocation.node)
            moves.append(
                Move(
                    pod=allocation.pod,
                    node=allocation.node,
                    card=allocation.cards[0],
                    units=allocation.amount,
                    unit_mib=node.inventory.unit_mib if node is not None else 1,
                    to=to,
                )
            )
        return tuple(moves)

    def _free_mib(self, placement: Placement) -> int:
        node = self._ledger.node(placement.node)
        if node is None:
            return 0
        return node.cards[placement.cards[0]].free * node.inventory.unit_mib

    def _add(self, allocation: Allocation) -> None:
        # A waiting pod's own hold (a reservation, a card claimed) is replaced by the ledger:
        # released here first, so that the undo puts it back.
        held = self._ledger.allocation(allocation.pod.uid)
        if held is not None:
            self._release(held)
        self._ledger.add(allocation)
        self._done.append(("add", allocation))

    def _release(self, allocation: Allocation) -> None:
        self._ledger.release(allocation.pod.uid)
        self._done.append(("release", allocation))

    def _undo_to(self, mark: int) -> None:
        while len(self._done) > mark:
            done, allocation = self._done.pop()
            if done == "add":
                self._ledger.release(allocation.pod.uid)
            else:
                self._ledger.add(allocation)

    def undo(self) -> None:
        self._undo_to(0)


class _NoRoom(Exception):
    pass

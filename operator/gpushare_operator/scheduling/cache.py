"""The scheduler's view of the cluster: nodes, GPU usage, pod requests, and assumed pods.

It is fed by the watches (observe_*/forget_*) and by the scheduler's own decisions
(assume/forget_assumed), and every mutation is synchronous, so a decision taken between two
awaits sees one consistent state. The GPU bookkeeping is the model's `Ledger`; the pods that
wait for their assignment are the exactness rule's `Pins`.

A pod's life here, as in kube-scheduler's cache::

    pending --assume--> assumed --watch shows it bound--> bound --finished/deleted--> gone
               ^            |
               +--forget----+  (the bind failed: back to pending)

An assumed pod counts at once (GPU card, cpu, memory), so the next decision sees it before
the watch does. A watch event that still shows an assumed pod unbound is stale and ignored.

A pending pod that waits for its best card (held back by the exactness rule for a moment) is
*reserved* there: its memory counts on that card until it is decided again, so the pods after
it are decided as if it were placed, as the model places pods one by one in creation order.
A pod that preempted is *nominated*: the card its victims are leaving is reserved for it in
the same way, and the nomination remembers the victims until they are gone.

For preemption the cache also keeps, of each bound pod that holds a card and is not
terminating, what victim selection weighs (`Evictable`), and the PodDisruptionBudgets.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from gpushare.model import (
    CardIndex,
    GpuKind,
    GpuShareError,
    Ledger,
    NodeCheck,
    NodeInventory,
    NodeName,
    Placement,
    PodRef,
    PodRequest,
    PodUid,
    claim_of,
    node_inventory,
)
from gpushare.model.annotations import format_card_indices
from gpushare.model.bodies import Body, path, text
from gpushare.model.contract import GPU_INDEX, GPU_MEMORY
from gpushare.model.disruption import Budget, budget_of
from gpushare.model.filters import NodeFacts, PodNeeds, node_facts, node_reason
from gpushare.model.preemption import Evictable, Evictables, GangHold, NodeCheckWithout, View
from gpushare.model.request import Signature
from gpushare.model.resources import PODS, add_into, pod_requests
from gpushare.model.volume_binding import ClaimBinding, ClaimNeeds, VolumeBook
from gpushare.model.volumes import PodVolumes, pod_volumes
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.exactness import ExactnessCheck, Pin, Pins
from gpushare_operator.scheduling.podinfo import Demand, PodInfo

if TYPE_CHECKING:
    from gpushare_operator.scheduling.decision import Plan


class PodChange(Enum):
    """What an observed pod event means for the scheduling queue."""

    PENDING = "pending"
    """Ours and unbound: (re)queue it."""
    BOUND = "bound"
    """Now holds resources on a node (or changed there)."""
    ASSIGNED = "assigned"
    """The kubelet started it: pods waiting behind it may go ahead."""
    GONE = "gone"
    """Finished or deleted: its resources are free again."""
    IGNORED = "ignored"


@dataclass(slots=True)
class _Holder:
    """A pod that holds resources on a node, observed or assumed. Kept small: there is one
    per running pod of the cluster."""

    ref: PodRef
    node: NodeName
    requests: dict[str, int]
    fingerprint: int | None
    """Observed pods: what the scheduler read of them, to skip events that change nothing
    it reads (status updates, the device plugin's gpu-assigned). None for assumed pods."""
    cards: tuple[CardIndex, ...] | None = None
    """The card(s) the pod holds by the cache's own record: those it was bound to here, or
    those its `gpu-index` named when the cache first saw it bound (after a restart the
    annotation is the only record). A later `gpu-index` that disagrees is not followed."""
    assigned: bool = False
    """The kubelet has started it: once seen, never undone by a later annotation."""
    terminating: bool = False
    """It is being deleted: what it holds is about to be free (`leaving`)."""
    pending: PodInfo | None = None
    """Assumed pods: the pending pod to restore if the bind fails."""
    pin: Pin | None = None
    """While it waits for the device plugin's assignment."""
    claims: ClaimBinding | None = None
    """Assumed pods: the claims their bind gives the node (`VolumeBook.select`)."""


@dataclass(frozen=True, slots=True)
class Nomination:
    """A pod that preempted: the placement it waits for and the victims that must go first."""

    placement: Placement
    victims: frozenset[PodUid]
    since: float


@dataclass(frozen=True, slots=True)
class NodeChange:
    changed: bool
    """Anything the filters or the GPU fit read has changed: parked pods may now fit."""
    problem: str | None = None
    """Why the node's GPUs cannot be used, when that just became so."""


_UNSEEN = object()


@dataclass(frozen=True, slots=True)
class PodObservation:
    change: PodChange
    problems: list[str] = field(default_factory=list)
    """Things the cache could not honour, for the caller to log (once per change)."""
    signature: Signature | None = None
    """ASSIGNED: the request signature whose pods may now take other cards of that node."""


def _filtered(
    claims: ClaimNeeds | str | None,
    needs: PodNeeds,
    node: NodeFacts,
    requested: Mapping[str, int],
) -> str | None:
    """Why `node` cannot take the pod, in kube-scheduler's order: what keeps the pod off
    every node (its claims' PreFilter), the node's filters, then its volumes' reach."""
    if isinstance(claims, str):
        return claims
    reason = node_reason(needs, node, requested)
    if reason is None and claims is not None:
        return claims.reason(node)
    return reason


class SchedulerCache:
    def __init__(
        self, *, config: Callable[[], OperatorConfig], clock: Callable[[], float] = time.time
    ) -> None:
        self.ledger = Ledger()
        self._config = config
        self._clock = clock
        self._facts: dict[NodeName, NodeFacts] = {}
        self._node_bodies: dict[NodeName, Body] = {}
        self._gpunodes: dict[NodeName, Body] = {}
        self._gpus: dict[NodeName, NodeInventory | str | None] = {}
        self._requested: dict[NodeName, dict[str, int]] = {}
        self._holders: dict[PodUid, _Holder] = {}
        self._pending: dict[PodUid, PodInfo] = {}
        self._reserved: dict[PodUid, tuple[Placement, dict[str, int]]] = {}
        self._pins = Pins()
        self._evictable = Evictables()
        self._budgets: dict[tuple[str, str], Budget] = {}
        self._nominated: dict[PodUid, Nomination] = {}
        self.volumes = VolumeBook()
        """PersistentVolumeClaims, PersistentVolumes and StorageClasses, as last seen."""

    # -- nodes and GPUNodes --------------------------------------------------------------

    def observe_node(self, body: Body) -> NodeChange:
        """Take a node's new state."""
        name = NodeName(text(path(body, "metadata").get("name")) or "")
        self._node_bodies[name] = body
        facts = node_facts(body)
        changed = self._facts.get(name) != facts
        self._facts[name] = facts
        return self._refresh_inventory(name, changed)

    def forget_node(self, name: NodeName) -> None:
        self._node_bodies.pop(name, None)
        self._facts.pop(name, None)
        self._gpus.pop(name, None)
        self.ledger.remove_node(name)
        self._pins.forget_node(name)

    def observe_gpunode(self, body: Body) -> NodeChange:
        name = NodeName(text(path(body, "metadata").get("name")) or "")
        self._gpunodes[name] = body
        return self._refresh_inventory(name, False)

    def forget_gpunode(self, name: NodeName) -> NodeChange:
        self._gpunodes.pop(name, None)
        return self._refresh_inventory(name, False)

    def _refresh_inventory(self, name: NodeName, changed: bool) -> NodeChange:
        node = self._node_bodies.get(name)
        if node is None:
            return NodeChange(changed=False)  # a GPUNode whose Node is not (yet) known
        gpus: NodeInventory | str | None
        try:
            gpus = node_inventory(node, self._gpunodes.get(name))
        except GpuShareError as error:
            gpus = str(error)
        if self._gpus.get(name, _UNSEEN) == gpus:
            return NodeChange(changed=changed)
        self._gpus[name] = gpus
        if isinstance(gpus, NodeInventory):
            self.ledger.set_node(gpus)
        else:
            self.ledger.set_node_without_gpu(name, gpus)
        return NodeChange(changed=True, problem=gpus if isinstance(gpus, str) else None)

    def node_names(self) -> list[NodeName]:
        return sorted(self._facts)

    def gpunode_names(self) -> list[NodeName]:
        return sorted(self._gpunodes)

    def gpunode(self, name: NodeName) -> Body | None:
        """The node's GPUNode resource as last seen."""
        return self._gpunodes.get(name)

    def node(self, name: NodeName) -> Body | None:
        """The node as last seen (slim)."""
        return self._node_bodies.get(name)

    # -- pods ----------------------------------------------------------------------------

    def is_ours(self, pod: PodInfo) -> bool:
        return pod.scheduler_name in self._config().scheduler_names

    def observe_pod(self, pod: PodInfo) -> PodObservation:
        uid = pod.uid
        if pod.finished or pod.node is not None:
            self.unreserve(uid)
            self._nominated.pop(uid, None)
        if pod.finished:
            self._pending.pop(uid, None)
            return PodObservation(PodChange.GONE if self._release(uid) else PodChange.IGNORED)
        if pod.node is None:
            return PodObservation(self._observe_unbound(pod))
        self._pending.pop(uid, None)
        previous = self._holders.get(uid)
        if previous is not None and previous.fingerprint == pod.fingerprint:
            previous.assigned = previous.assigned or pod.assigned
            if pod.assigned and previous.pin is not None:  # the kubelet started it
                signature = previous.pin.signature
                self._pins.assigned(previous.pin, self._clock())
                previous.pin = None
                return PodObservation(PodChange.ASSIGNED, signature=signature)
            return PodObservation(PodChange.IGNORED)  # nothing the scheduler reads changed
        waited = previous.pin if previous is not None else None
        self._release(uid)
        problems = []
        try:
            requests = pod_requests(pod.body)
        except GpuShareError as error:
            problems.append(f"{error}; only its pod slot is counted")
            requests = {PODS: 1}
        claim = claim_of(pod.body)
        allocation = claim.allocation
        # The cards of a pod seen bound before are the cache's record; an assumption is not:
        # its bind may never have gone through, and another leader may have bound the pod
        # elsewhere (what the Binding wrote is then the truth).
        recorded = previous.cards if previous is not None and previous.pending is None else None
        if allocation is not None and recorded is not None and allocation.cards != recorded:
            problems.append(
                f"pod {pod.ref}: {GPU_INDEX} reads {format_card_indices(allocation.cards)!r} "
                f"but gpushare placed it on card {format_card_indices(recorded)}; someone other "
                f"than gpushare changed the annotation, which moves nothing: card "
                f"{format_card_indices(recorded)} stays counted"
            )
            allocation = dataclasses.replace(allocation, cards=recorded)
        elif claim.problem:
            problems.append(claim.problem)
        assigned = pod.assigned or (previous is not None and previous.assigned)
        holder = _Holder(
            pod.ref,
            pod.node,
            requests,
            pod.fingerprint,
            assigned=assigned,
            terminating=pod.terminating,
        )
        if allocation is not None:
            self.ledger.add(allocation)
            holder.cards = allocation.cards
            if allocation.cards and not pod.terminating:
                victim = Evictable(
                    ref=pod.ref,
                    priority=pod.priority,
                    started_s=pod.started_s,
                    labels=pod.labels,
                    gang=pod.group,
                    # A pod with claims may not follow its volume elsewhere (a zonal or
                    # local disk, one node at a time): defragmentation leaves it be.
                    movable=pod.controlled
                    and allocation.kind is GpuKind.MEMORY
                    and pod_volumes(pod.body) is None,
                )
                self._evictable.put(victim, pod.node, min(allocation.cards))
            if allocation.cards and claim.request and not assigned and not pod.terminating:
                # The wait counts from what this cache saw (its bind, or the first sight of
                # the bound pod), never from a predicate-time anyone could have written.
                since = waited.since if waited is not None else self._clock()
                holder.pin = Pin(
                    pod.ref, pod.node, claim.request.signature, allocation.cards, since
                )
        self._hold(holder)
        if waited is not None and holder.pin is None:
            self._pins.assigned(waited, self._clock())
            return PodObservation(PodChange.ASSIGNED, problems, signature=waited.signature)
        return PodObservation(PodChange.BOUND, problems)

    def _observe_unbound(self, pod: PodInfo) -> PodChange:
        holder = self._holders.get(pod.uid)
        if holder is not None and holder.pending is not None:
            return PodChange.IGNORED  # a stale event from before our bind (it is assumed)
        if not self.is_ours(pod) or pod.terminating:
            self._pending.pop(pod.uid, None)
            self.unreserve(pod.uid)
            return PodChange.IGNORED
        previous = self._pending.get(pod.uid)
        self._pending[pod.uid] = pod
        if previous is not None and previous.body["spec"] == pod.body["spec"]:
            # Only its status changed (our own PodScheduled condition, say): trying again
            # would loop on our own writes.
            return PodChange.IGNORED
        return PodChange.PENDING

    def forget_pod(self, uid: PodUid) -> PodChange:
        """The pod was deleted (its resources are free; pods behind its card may go)."""
        self._pending.pop(uid, None)
        self._nominated.pop(uid, None)
        self.unreserve(uid)
        return PodChange.GONE if self._release(uid) else PodChange.IGNORED

    def pending(self, uid: PodUid) -> PodInfo | None:
        """The latest state of a pod that waits to be scheduled by us."""
        return self._pending.get(uid)

    def holds(self, uid: PodUid) -> bool:
        """Whether the pod is bound here, or assumed (its bind under way)."""
        return uid in self._holders

    def could_hold(self, amounts: Mapping[str, int]) -> bool:
        """Whether the cluster's free resources, summed over its ready nodes, cover `amounts`
        (a PodGroup's minResources: Volcano's enqueue check; gpu-memory in MiB)."""
        for resource, amount in amounts.items():
            if resource == GPU_MEMORY:
                free = sum(
                    usage.free * usage.inventory.unit_mib for usage in self.ledger.nodes().values()
                )
            else:
                free = sum(
                    facts.allocatable.get(resource, 0) - self.requested(name).get(resource, 0)
                    for name, facts in self._facts.items()
                    if facts.ready and not facts.unschedulable
                )
            if free < amount:
                return False
        return True

    def pending_uids(self) -> list[PodUid]:
        return list(self._pending)

    def known_pod_uids(self) -> set[str]:
        """Every pod the cache holds or waits on (assumed binds included)."""
        return {*self._pending, *self._holders}

    # -- decisions -----------------------------------------------------------------------

    def assume(self, pod: PodInfo, plan: Plan) -> None:
        """Count a pod where `plan` puts it (and its card, if any) before the bind is
        confirmed."""
        # Its nomination stays until it is bound (`observe_pod`): a gang member assumed for a
        # trial and forgotten keeps the card it was nominated to.
        self._pending.pop(pod.uid, None)
        holder = _Holder(pod.ref, plan.node, dict(plan.needs.requests), None, pending=pod)
        if plan.claims is not None:
            self.volumes.select(plan.claims)
            holder.claims = plan.claims
        if plan.placement is not None:
            self.ledger.add(plan.placement.allocation(pod.ref))
            holder.cards = plan.placement.cards
            holder.pin = Pin(
                pod.ref, plan.node, plan.request.signature, plan.placement.cards, self._clock()
            )
        self._hold(holder)

    def reserve(self, pod: PodInfo, placement: Placement) -> None:
        """Count a pending pod on the card(s) it waits for, and its other requests (cpu,
        memory, host ports) on that node, as kube-scheduler counts a nominated pod, until
        `unreserve`."""
        self.unreserve(pod.uid)
        requests = dict(pod.demand.needs.requests) if isinstance(pod.demand, Demand) else {}
        self.ledger.add(placement.allocation(pod.ref))
        add_into(self._requested.setdefault(placement.node, {}), requests)
        self._reserved[pod.uid] = (placement, requests)

    def unreserve(self, uid: PodUid) -> Placement | None:
        """Drop the pod's reservation, if it has one (it is decided again, bound or gone);
        returns what it had reserved."""
        reserved = self._reserved.pop(uid, None)
        if reserved is None:
            return None
        placement, requests = reserved
        self.ledger.release(uid)
        on_node = self._requested.get(placement.node)
        if on_node is not None:
            add_into(on_node, requests, -1)
            if not on_node:
                del self._requested[placement.node]
        return placement

    def forget_assumed(self, uid: PodUid) -> PodInfo | None:
        """Undo `assume` after a failed bind; the pod is pending again (and returned)."""
        holder = self._holders.get(uid)
        if holder is None or holder.pending is None:
            return None
        self._release(uid)
        if holder.claims is not None:
            self.volumes.unselect(holder.claims)
        self._pending[uid] = holder.pending
        return holder.pending

    def claims_bound(self, uid: PodUid) -> None:
        """An assumed pod's claims are bound and its Binding goes out now: its wait for the
        device plugin's assignment counts from here, not from the decision."""
        holder = self._holders.get(uid)
        if holder is None or holder.pin is None:
            return
        self._pins.remove(holder.pin)
        holder.pin = dataclasses.replace(holder.pin, since=self._clock())
        self._pins.add(holder.pin)

    def node_check(self, needs: PodNeeds, volumes: PodVolumes | None = None) -> NodeCheck:
        """The non-GPU filters for a pod with `needs` and `volumes`, against the current
        state."""
        claims = self.claim_needs(volumes)

        def check(node: NodeName) -> str | None:
            facts = self._facts.get(node)
            if facts is None:
                return "node(s) were not found"
            return _filtered(claims, needs, facts, self._requested.get(node, {}))

        return check

    def node_check_without(
        self, needs: PodNeeds, volumes: PodVolumes | None = None
    ) -> NodeCheckWithout:
        """`node_check` as it would answer once the given pods are gone (preemption)."""
        claims = self.claim_needs(volumes)

        def check(node: NodeName, gone: frozenset[PodUid]) -> str | None:
            facts = self._facts.get(node)
            if facts is None:
                return "node(s) were not found"
            requested = dict(self._requested.get(node, {}))
            for uid in gone:
                holder = self._holders.get(uid)
                if holder is not None and holder.node == node:
                    add_into(requested, holder.requests, -1)
            return _filtered(claims, needs, facts, requested)

        return check

    # -- volumes -------------------------------------------------------------------------

    def claim_needs(self, volumes: PodVolumes | None) -> ClaimNeeds | str | None:
        """A pod's claims as they stand (`VolumeBook.needs`); None for a pod without claims,
        or while the claims cannot be read (nothing is then checked)."""
        if volumes is None or not self.volumes.listed:
            return None
        return self.volumes.needs(volumes)

    def claim_binding(self, volumes: PodVolumes | None, node: NodeName) -> ClaimBinding | None:
        """What binding a pod with `volumes` to `node` asks of its claims first."""
        claims = self.claim_needs(volumes)
        facts = self._facts.get(node)
        if not isinstance(claims, ClaimNeeds) or facts is None:
            return None
        return claims.binding(facts)

    def binding_state(self, binding: ClaimBinding) -> str | None:
        """`VolumeBook.binding_state` against the node as it is now."""
        return self.volumes.binding_state(binding, self._facts.get(NodeName(binding.node)))

    def card_check(self, request: PodRequest, namespace: str) -> ExactnessCheck:
        """The exactness rule for a pod of `namespace` with `request`, at this moment."""
        timeout_s = self._config().assignment_timeout_s
        return self._pins.check(
            request,
            namespace,
            now=self._clock(),
            timeout_s=timeout_s,
            identifies_pods=self._identifies_pods,
        )

    def _identifies_pods(self, node: NodeName) -> bool:
        inventory = self._gpus.get(node)
        return isinstance(inventory, NodeInventory) and inventory.identifies_pods

    def requested(self, node: NodeName) -> Mapping[str, int]:
        return self._requested.get(node, {})

    def facts(self) -> Mapping[NodeName, NodeFacts]:
        return self._facts

    # -- preemption ----------------------------------------------------------------------

    def observe_budget(self, body: Body) -> bool:
        """Take a PodDisruptionBudget; whether it now allows more evictions than before."""
        budget = budget_of(body)
        before = self._budgets.get((budget.namespace, budget.name))
        self._budgets[budget.namespace, budget.name] = budget
        return before is None or budget.allowed > before.allowed

    def forget_budget(self, namespace: str, name: str) -> None:
        self._budgets.pop((namespace, name), None)

    def budget_keys(self) -> set[tuple[str, str]]:
        return set(self._budgets)

    def preemption_view(self, gangs: Mapping[Hashable, GangHold]) -> View:
        """What victim selection reads now (the evictable pods are the cache's own table,
        not a copy: read it before the next change)."""
        return View(
            pods=self._evictable,
            gangs=gangs,
            budgets=tuple(self._budgets.values()),
            now_s=self._clock(),
        )

    def cards_of(self, uid: PodUid) -> tuple[NodeName, tuple[CardIndex, ...]] | None:
        """Where a bound (or assumed) pod holds cards, by the cache's record."""
        holder = self._holders.get(uid)
        if holder is None or not holder.cards:
            return None
        return holder.node, holder.cards

    def leaving(self, node: NodeName, card: CardIndex) -> frozenset[PodUid]:
        """The pods on a card that are being deleted (their memory about to be free)."""
        usage = self.ledger.node(node)
        if usage is None or card not in usage.cards:
            return frozenset()
        return frozenset(
            uid
            for uid in usage.cards[card].pods
            if (holder := self._holders.get(uid)) is not None and holder.terminating
        )

    def clock(self) -> float:
        return self._clock()

    def nominate(self, uid: PodUid, placement: Placement, victims: frozenset[PodUid]) -> None:
        """The pod preempted `victims` to go where `placement` says (reserved as it parks)."""
        self._nominated[uid] = Nomination(placement, victims, self._clock())

    def nomination(self, uid: PodUid) -> Nomination | None:
        return self._nominated.get(uid)

    def drop_nomination(self, uid: PodUid) -> None:
        self._nominated.pop(uid, None)

    def victims_left(self, nomination: Nomination) -> int:
        """How many of the nomination's victims still hold their cards (terminating ones too)."""
        return sum(1 for uid in nomination.victims if uid in self._holders)

    def nominations(self) -> Mapping[PodUid, Nomination]:
        return self._nominated

    # -- bookkeeping ---------------------------------------------------------------------

    def _unpin(self, holder: _Holder) -> None:
        if holder.pin is not None:
            self._pins.remove(holder.pin)
            holder.pin = None

    def _hold(self, holder: _Holder) -> None:
        self._holders[holder.ref.uid] = holder
        add_into(self._requested.setdefault(holder.node, {}), holder.requests)
        if holder.pin is not None:
            self._pins.add(holder.pin)

    def _release(self, uid: PodUid) -> bool:
        holder = self._holders.pop(uid, None)
        if holder is None:
            return False
        self._evictable.discard(uid)
        self.ledger.release(uid)
        requested = self._requested.get(holder.node)
        if requested is not None:
            add_into(requested, holder.requests, -1)
            if not requested:
                del self._requested[holder.node]
        self._unpin(holder)
        return True

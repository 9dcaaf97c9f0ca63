"""One scheduling decision, pure: where a pod would go now, or why it cannot.

The scheduler assumes and binds what `plan` returns; the `gpushare` CLI (explain, simulate)
calls the same function on a cache built from one LIST, so what it says is what the operator
would do.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from gpushare.model import (
    CardCheck,
    CardIndex,
    Diagnosis,
    GpuKind,
    Ledger,
    NodeCheck,
    NodeName,
    Placement,
    PodRef,
    PodRequest,
    contract,
    diagnose,
    find_placement,
)
from gpushare.model.filters import PodNeeds, choose_node
from gpushare.model.placement import Policy, served_check, unit_check
from gpushare.model.usage import PodUid
from gpushare.model.volume_binding import ClaimBinding
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.exactness import ExactnessCheck
from gpushare_operator.scheduling.podinfo import Demand, PodInfo

QUIET_WAIT_S = 10.0
"""How long a pod whose best card is held back by the exactness rule waits for it, quietly,
while the node's kubelet assigns nothing (`ExactnessCheck.stalled_s`): the kubelet's Allocate
normally follows a bind within a second, so the pod gets the card the model gives it (one by
one, in order) instead of a worse one elsewhere. A kubelet busy starting containers admits
one pod every few seconds (3 to 5 s were seen in CI): each admission restarts the wait. When
the node stalls that long, the pod takes the next best card that the rule allows, or, if there
is none, is reported unschedulable."""


@dataclass(frozen=True, slots=True)
class Refusal:
    message: str
    retry_in_s: float | None = None
    wake_key: Hashable = None
    """The request signature: an assignment of a pod with it may let this one go."""
    quiet: bool = False
    """Only the exactness rule holds it, briefly (`QUIET_WAIT_S`): nothing to report."""
    waits_for: Placement | None = None
    """The placement it waits for (reserved meanwhile, `SchedulerCache.reserve`): its best,
    held back by the exactness rule (quiet), or the one it preempted for."""
    nominated: NodeName | None = None
    """It preempted: the node its victims are leaving (`status.nominatedNodeName`)."""


@dataclass(frozen=True, slots=True)
class Plan:
    node: NodeName
    placement: Placement | None
    """None for a pod that asks for no GPU."""
    request: PodRequest
    needs: PodNeeds
    expired: Mapping[PodUid, PodRef] = field(default_factory=dict)
    """Earlier pods of the same request whose assignment wait ran out (logged)."""
    claims: ClaimBinding | None = None
    """What its claims need before it is bound: a volume given, or a node selected."""


def plan(
    cache: SchedulerCache, pod: PodInfo, policy: Policy, waited_for: Placement | None = None
) -> Plan | Refusal:
    """Where `pod` goes now, or why not. `waited_for`: the placement the pod was reserved
    while it waited (`SchedulerCache.reserve`, dropped before this call); still its best while
    it fits, since the pods decided meanwhile were decided around it."""
    if pod.demand is None:
        return Refusal(f"pod {pod.ref} is already bound to node {pod.node}")
    if isinstance(pod.demand, str):
        return Refusal(pod.demand)
    request, needs, volumes = pod.demand.request, pod.demand.needs, pod.demand.volumes
    if request.kind is None:
        check = cache.node_check(needs, volumes)
        chosen = choose_node(cache.facts(), cache.requested, needs, check)
        if isinstance(chosen, Diagnosis):
            return Refusal(chosen.summary())
        return Plan(
            node=chosen,
            placement=None,
            request=request,
            needs=needs,
            claims=cache.claim_binding(volumes, chosen),
        )
    return _place(cache, pod.demand, pod.ref.namespace, policy, waited_for)


def node_check_of(cache: SchedulerCache, demand: Demand) -> NodeCheck:
    """Every filter before the card fit: the node's device plugin runs the pod's memory unit
    and serves its scheduler name, and the Node passes kube-scheduler's filters."""
    return unit_check(
        cache.ledger,
        demand.unit_mib,
        served_check(
            cache.ledger, demand.scheduler_name, cache.node_check(demand.needs, demand.volumes)
        ),
    )


def _place(
    cache: SchedulerCache,
    demand: Demand,
    namespace: str,
    policy: Policy,
    waited_for: Placement | None,
) -> Plan | Refusal:
    """The best card(s) for a GPU pod; while the exactness rule holds them, a quiet wait
    (`QUIET_WAIT_S`), then the next best."""
    request = demand.request
    exactness = cache.card_check(request, namespace)
    node_check = node_check_of(cache, demand)
    best = None
    if waited_for is not None:
        best = find_placement(
            cache.ledger, request, policy, node_check=node_check, card_check=_only(waited_for)
        )
    best = best or find_placement(cache.ledger, request, policy, node_check=node_check)
    if best is None:
        summary = diagnose(cache.ledger, request, node_check, exactness).summary()
        return Refusal(
            summary + _unconverted(cache, demand), exactness.first_wait_ends_in, request.signature
        )
    held = next(filter(None, (exactness(best.node, card) for card in best.cards)), None)
    if held is None:
        return _plan(cache, best, demand, exactness)
    other = find_placement(
        cache.ledger, request, policy, node_check=node_check, card_check=exactness
    )
    if other is not None and _as_good(cache.ledger, best, other):
        return _plan(cache, other, demand, exactness)  # nothing worth waiting for
    where = f"{best.node} card {','.join(map(str, best.cards))}"
    waited_s = exactness.stalled_s(best.node)
    if waited_s < QUIET_WAIT_S:  # the assignment it waits for wakes it; else retried then
        message = f"waiting for its best fit, {where}: {held}"
        return Refusal(
            message, QUIET_WAIT_S - waited_s, request.signature, quiet=True, waits_for=best
        )
    if other is not None:  # the kubelet is slow to admit the pod it waits for
        return _plan(cache, other, demand, exactness)
    nodes = len(cache.ledger.nodes()) + len(cache.ledger.nodes_without_gpu())
    message = f"0/{nodes} nodes are available now; the best fit is {where}, {held}"
    return Refusal(message, exactness.first_wait_ends_in, request.signature)


def _unconverted(cache: SchedulerCache, demand: Demand) -> str:
    """Why a gpu-memory pod the webhook never saw may ask far more than its author meant:
    its limits are read as devices of the node's unit, and a limit written in MiB asks that
    many devices (the kubelet would count them so too)."""
    if demand.request.kind is not GpuKind.MEMORY or demand.unit_mib is not None:
        return ""
    units = sorted({usage.inventory.unit_mib for usage in cache.ledger.nodes().values()} - {1})
    if not units:
        return ""
    return (
        f"; its {GpuKind.MEMORY.value} limits count devices of "
        f"{'/'.join(map(str, units))} MiB: it carries no {contract.MEMORY_UNIT_MIB}, so "
        "gpushare's admission webhook never converted them (it was created while the webhook "
        "did not run). If they are MiB, delete the pod and create it again"
    )


def _as_good(ledger: Ledger, best: Placement, other: Placement) -> bool:
    """Whether `other` leaves the cluster as `best` would, but for names: a gpu-memory card
    with the same free memory, both idle or both in use. Best-fit's later choices then see
    the same free amounts, and the cards in use and the memory stranded come out the same
    (a burst of one size over many like nodes goes on without waiting for any kubelet)."""
    if best.kind is not GpuKind.MEMORY:
        return False
    chosen, alternative = ledger.nodes()[best.node], ledger.nodes()[other.node]
    a, b = chosen.cards[best.cards[0]], alternative.cards[other.cards[0]]
    return a.free == b.free and bool(a.pods) == bool(b.pods)


def _only(placement: Placement) -> CardCheck:
    def check(node: NodeName, card: CardIndex) -> str | None:
        if node == placement.node and card in placement.cards:
            return None
        return "not the card the pod waited for"

    return check


def _plan(
    cache: SchedulerCache, placement: Placement, demand: Demand, exactness: ExactnessCheck
) -> Plan:
    return Plan(
        node=placement.node,
        placement=placement,
        request=demand.request,
        needs=demand.needs,
        expired=dict(exactness.expired),
        claims=cache.claim_binding(demand.volumes, placement.node),
    )

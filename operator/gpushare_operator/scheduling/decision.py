"""One scheduling decision, pure: where a pod would go now, or why it cannot.

The scheduler assumes and binds what `plan` returns; the `gpushare` CLI (explain, simulate)
calls the same function on a cache built from one LIST, so what it says is what the operator
would do.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from gpushare.model import (
    Diagnosis,
    NodeCheck,
    NodeName,
    Placement,
    PodRef,
    PodRequest,
    diagnose,
    find_placement,
)
from gpushare.model.filters import PodNeeds, choose_node
from gpushare.model.placement import Policy, unit_check
from gpushare.model.usage import PodUid
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.exactness import ExactnessCheck
from gpushare_operator.scheduling.podinfo import PodInfo

QUIET_WAIT_S = 5.0
"""A pod held back only by the exactness rule is not reported unschedulable until the pod it
waits for has been unassigned this long: the kubelet's Allocate normally follows a bind within
a second, so a shorter wait is the rule working, not a problem worth an event."""


@dataclass(frozen=True, slots=True)
class Refusal:
    message: str
    retry_in_s: float | None = None
    wake_key: Hashable = None
    """The request signature: an assignment of a pod with it may let this one go."""
    quiet: bool = False
    """Only the exactness rule holds it, briefly (`QUIET_WAIT_S`): nothing to report."""


@dataclass(frozen=True, slots=True)
class Plan:
    node: NodeName
    placement: Placement | None
    """None for a pod that asks for no GPU."""
    request: PodRequest
    needs: PodNeeds
    expired: Mapping[PodUid, PodRef] = field(default_factory=dict)
    """Earlier pods of the same request whose assignment wait ran out (logged)."""


def plan(cache: SchedulerCache, pod: PodInfo, policy: Policy) -> Plan | Refusal:
    if pod.demand is None:
        return Refusal(f"pod {pod.ref} is already bound to node {pod.node}")
    if isinstance(pod.demand, str):
        return Refusal(pod.demand)
    request, needs, unit_mib = pod.demand.request, pod.demand.needs, pod.demand.unit_mib
    if request.kind is None:
        chosen = choose_node(cache.facts(), cache.requested, needs)
        if isinstance(chosen, Diagnosis):
            return Refusal(chosen.summary())
        return Plan(node=chosen, placement=None, request=request, needs=needs)
    exactness = cache.card_check(request)
    node_check = unit_check(cache.ledger, unit_mib, cache.node_check(needs))
    result = find_placement(
        cache.ledger, request, policy, node_check=node_check, card_check=exactness
    )
    if result is None:
        # Retried when an assignment wait that held a card back runs out, at the latest.
        message, held = why_not(cache, request, node_check, exactness, policy)
        retry_in_s = exactness.first_wait_ends_in
        quiet = held and exactness.longest_wait_s < QUIET_WAIT_S
        if quiet:  # decided again when it is no longer quiet, to report it then
            retry_in_s = min(retry_in_s or QUIET_WAIT_S, QUIET_WAIT_S - exactness.longest_wait_s)
        return Refusal(message, retry_in_s, request.signature, quiet=quiet)
    return Plan(
        node=result.node,
        placement=result,
        request=request,
        needs=needs,
        expired=dict(exactness.expired),
    )


def why_not(
    cache: SchedulerCache,
    request: PodRequest,
    node_check: NodeCheck,
    exactness: ExactnessCheck,
    policy: Policy,
) -> tuple[str, bool]:
    """The message for a pod that fits nowhere now, and whether only the exactness rule holds
    it. When it would fit but for the rule (a burst of same-size pods waiting for the
    kubelets), say so directly: a full diagnosis visits every card, too dear to repeat for
    each of them."""
    ledger = cache.ledger
    blocked = find_placement(ledger, request, policy, node_check=node_check)
    if blocked is not None:
        card = blocked.cards[0]
        message = (
            f"0/{len(ledger.nodes()) + len(ledger.nodes_without_gpu())} nodes are "
            f"available now; the best fit is {blocked.node} card {card}, "
            f"{exactness(blocked.node, card)}"
        )
        return message, True
    return diagnose(ledger, request, node_check, exactness).summary(), False

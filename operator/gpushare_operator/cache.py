"""The scheduler's view of the cluster: nodes, GPU usage, pod requests, and assumed pods.

It is fed by the watches (observe_*/forget_*) and by the scheduler's own decisions
(assume/forget_assumed), and every mutation is synchronous, so a decision taken between two
awaits sees one consistent state. The GPU bookkeeping is the model's `Ledger`.

A pod's life here, as in kube-scheduler's cache::

    pending --assume--> assumed --watch shows it bound--> bound --finished/deleted--> gone
               ^            |
               +--forget----+  (the bind failed: back to pending)

An assumed pod counts at once (GPU card, cpu, memory), so the next decision sees it before
the watch does. A watch event that still shows an assumed pod unbound is stale and ignored.

The exactness rule (docs/architecture.md, "The exactness rule"): the kubelet's Allocate names
device ids, never the pod, so two pods on one node with the same request signature, both not
yet `gpu-assigned`, must hold the same card; otherwise the device plugin could not tell them
apart. `card_check` holds back other cards of that node for such a pod until the earlier one
is assigned, or until `assignment_timeout_s` has passed (then it goes ahead, and says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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
    contract,
    node_inventory,
    pod_ref,
)
from gpushare.model.annotations import gpu_assigned, predicate_time_s
from gpushare.model.bodies import Body, annotations_of, path, sequence, text
from gpushare.model.filters import NodeFacts, PodNeeds, node_facts, node_reason
from gpushare.model.resources import PODS, add_into, pod_requests
from gpushare.model.usage import FINISHED_PHASES

Signature = tuple[str, tuple[tuple[bool, int], ...]]


class PodChange(Enum):
    """What an observed pod event means for the scheduling queue."""

    PENDING = "pending"
    """Ours and unbound: (re)queue it."""
    BOUND = "bound"
    """Now holds resources on a node (or changed there)."""
    ASSIGNED = "assigned"
    """The device plugin served it: pods waiting behind it may go ahead."""
    GONE = "gone"
    """Finished or deleted: its resources are free again."""
    IGNORED = "ignored"


@dataclass(slots=True)
class _Holder:
    """A pod that holds resources on a node, observed or assumed."""

    ref: PodRef
    node: NodeName
    requests: dict[str, int]
    assumed: bool
    pin: tuple[Signature, tuple[CardIndex, ...], float] | None = None
    """(signature, cards, since) while it waits for the device plugin's assignment."""
    body: Body | None = None
    """For assumed pods: the pending body to restore if the bind fails."""
    fingerprint: int | None = None
    """For observed pods: what the scheduler read of them, to skip events that change
    nothing it reads (status updates, most annotation changes)."""


@dataclass(frozen=True, slots=True)
class NodeChange:
    changed: bool
    """Anything the filters or the GPU fit read has changed: parked pods may now fit."""
    problem: str | None = None
    """Why the node's GPUs cannot be used, when that just became so."""


_UNSEEN = object()


@dataclass(slots=True)
class Problems:
    """Things the cache could not honour, for the caller to log (once per change)."""

    messages: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PodObservation:
    change: PodChange
    problems: Problems = field(default_factory=Problems)
    signature: Signature | None = None
    """ASSIGNED: the request signature whose pods may now take other cards of that node."""


class SchedulerCache:
    def __init__(
        self,
        *,
        scheduler_names: frozenset[str],
        assignment_timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = Ledger()
        self.scheduler_names = scheduler_names
        self.assignment_timeout_s = assignment_timeout_s
        self._clock = clock
        self._facts: dict[NodeName, NodeFacts] = {}
        self._node_bodies: dict[NodeName, Body] = {}
        self._gpunodes: dict[NodeName, Body] = {}
        self._gpus: dict[NodeName, NodeInventory | str | None] = {}
        self._requested: dict[NodeName, dict[str, int]] = {}
        self._holders: dict[PodUid, _Holder] = {}
        self._pending: dict[PodUid, Body] = {}
        # signature -> node -> pods holding a card there, bound but not yet assigned
        self._pins: dict[Signature, dict[NodeName, dict[PodUid, _Holder]]] = {}

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

    # -- pods ----------------------------------------------------------------------------

    def is_ours(self, pod: Body) -> bool:
        return text(path(pod, "spec").get("schedulerName")) in self.scheduler_names

    def observe_pod(self, body: Body) -> PodObservation:
        problems = Problems()
        ref = pod_ref(body)
        uid = ref.uid
        spec = path(body, "spec")
        node = text(spec.get("nodeName"))
        finished = text(path(body, "status").get("phase")) in FINISHED_PHASES
        if finished:
            self._pending.pop(uid, None)
            return PodObservation(PodChange.GONE if self._release(uid) else PodChange.IGNORED)
        if not node:
            return PodObservation(self._observe_unbound(uid, body))
        self._pending.pop(uid, None)
        previous = self._holders.get(uid)
        fingerprint = _fingerprint(body)
        assigned = gpu_assigned(annotations_of(body))
        if previous is not None and not previous.assumed and previous.fingerprint == fingerprint:
            if assigned and previous.pin is not None:  # the device plugin served it
                signature = previous.pin[0]
                self._unpin(uid, previous)
                return PodObservation(PodChange.ASSIGNED, signature=signature)
            return PodObservation(PodChange.IGNORED)  # nothing the scheduler reads changed
        waited_as = previous.pin[0] if previous is not None and previous.pin else None
        self._release(uid)
        try:
            requests = pod_requests(body)
        except GpuShareError as error:
            problems.messages.append(f"{error}; only its pod slot is counted")
            requests = {PODS: 1}
        claim = claim_of(body)
        if claim.problem:
            problems.messages.append(claim.problem)
        holder = _Holder(
            ref=ref, node=NodeName(node), requests=requests, assumed=False, fingerprint=fingerprint
        )
        if claim.allocation is not None:
            self.ledger.add(claim.allocation)
            terminating = path(body, "metadata").get("deletionTimestamp") is not None
            if claim.allocation.cards and claim.request and not assigned and not terminating:
                since = predicate_time_s(annotations_of(body)) or self._clock()
                holder.pin = (claim.request.signature, claim.allocation.cards, since)
        self._hold(uid, holder)
        if waited_as is not None and holder.pin is None:
            return PodObservation(PodChange.ASSIGNED, problems, signature=waited_as)
        return PodObservation(PodChange.BOUND, problems)

    def _observe_unbound(self, uid: PodUid, body: Body) -> PodChange:
        holder = self._holders.get(uid)
        if holder is not None and holder.assumed:
            return PodChange.IGNORED  # a stale event from before our bind
        terminating = path(body, "metadata").get("deletionTimestamp") is not None
        if not self.is_ours(body) or terminating:
            self._pending.pop(uid, None)
            return PodChange.IGNORED
        previous = self._pending.get(uid)
        if previous is not None and path(previous, "spec") == path(body, "spec"):
            # Only its status changed (our own PodScheduled condition, say): trying again
            # would loop on our own writes.
            return PodChange.IGNORED
        self._pending[uid] = body
        return PodChange.PENDING

    def forget_pod(self, uid: PodUid) -> PodChange:
        """The pod was deleted (its resources are free; pods behind its card may go)."""
        self._pending.pop(uid, None)
        return PodChange.GONE if self._release(uid) else PodChange.IGNORED

    def pending(self, uid: PodUid) -> Body | None:
        """The latest body of a pod that waits to be scheduled by us."""
        return self._pending.get(uid)

    def pending_uids(self) -> list[PodUid]:
        return list(self._pending)

    def known_pod_uids(self) -> set[str]:
        """Every pod the cache holds or waits on (assumed binds included)."""
        return {*self._pending, *self._holders}

    # -- decisions -----------------------------------------------------------------------

    def assume(
        self,
        body: Body,
        placement: Placement | None,
        node: NodeName,
        request: PodRequest,
        requests: Mapping[str, int],
    ) -> None:
        """Count a pod on `node` (and its card, if any) before the bind is confirmed."""
        ref = pod_ref(body)
        self._pending.pop(ref.uid, None)
        holder = _Holder(ref=ref, node=node, requests=dict(requests), assumed=True, body=body)
        if placement is not None:
            self.ledger.add(placement.allocation(ref))
            holder.pin = (request.signature, placement.cards, self._clock())
        self._hold(ref.uid, holder)

    def forget_assumed(self, uid: PodUid) -> Body | None:
        """Undo `assume` after a failed bind; the pod is pending again (its body returned)."""
        holder = self._holders.get(uid)
        if holder is None or not holder.assumed:
            return None
        self._release(uid)
        if holder.body is not None:
            self._pending[uid] = holder.body
        return holder.body

    def is_assumed(self, uid: PodUid) -> bool:
        holder = self._holders.get(uid)
        return holder is not None and holder.assumed

    def node_check(self, needs: PodNeeds) -> NodeCheck:
        """The non-GPU filters for a pod with `needs`, against the current state."""

        def check(node: NodeName) -> str | None:
            facts = self._facts.get(node)
            if facts is None:
                return "node(s) were not found"
            return node_reason(needs, facts, self._requested.get(node, {}))

        return check

    def card_check(self, request: PodRequest) -> ExactnessCheck:
        """The exactness rule for a pod with `request`, at this moment."""
        return ExactnessCheck(
            self._pins.get(request.signature, {}),
            request.kind,
            now=self._clock(),
            timeout_s=self.assignment_timeout_s,
        )

    def requested(self, node: NodeName) -> Mapping[str, int]:
        return self._requested.get(node, {})

    def facts(self) -> Mapping[NodeName, NodeFacts]:
        return self._facts

    def holders_on(self, node: NodeName) -> list[PodRef]:
        return [h.ref for h in self._holders.values() if h.node == node]

    # -- bookkeeping ---------------------------------------------------------------------

    def _unpin(self, uid: PodUid, holder: _Holder) -> None:
        if holder.pin is None:
            return
        by_node = self._pins.get(holder.pin[0], {})
        pinned = by_node.get(holder.node, {})
        pinned.pop(uid, None)
        if not pinned:
            by_node.pop(holder.node, None)
        if not by_node:
            self._pins.pop(holder.pin[0], None)
        holder.pin = None

    def _hold(self, uid: PodUid, holder: _Holder) -> None:
        self._holders[uid] = holder
        add_into(self._requested.setdefault(holder.node, {}), holder.requests)
        if holder.pin is not None:
            by_node = self._pins.setdefault(holder.pin[0], {})
            by_node.setdefault(holder.node, {})[uid] = holder

    def _release(self, uid: PodUid) -> bool:
        holder = self._holders.pop(uid, None)
        if holder is None:
            return False
        self.ledger.release(uid)
        requested = self._requested.get(holder.node)
        if requested is not None:
            add_into(requested, holder.requests, -1)
            if not requested:
                del self._requested[holder.node]
        self._unpin(uid, holder)
        return True


class ExactnessCheck:
    """The exactness rule as a CardCheck for one decision: cards of a node held back because
    an earlier pod of the same signature there is not yet assigned. It remembers what it saw:
    waits that ran out (to log) and when the first live wait ends (to retry then)."""

    def __init__(
        self,
        pins: Mapping[NodeName, Mapping[PodUid, _Holder]],
        kind: GpuKind | None,
        *,
        now: float,
        timeout_s: float,
    ) -> None:
        self._pins = pins
        self._kind = kind
        self._now = now
        self._timeout_s = timeout_s
        self.expired: dict[PodUid, PodRef] = {}
        self.first_wait_ends_in: float | None = None
        self._rules: dict[NodeName, tuple[frozenset[CardIndex], str] | None] = {}

    def __call__(self, node: NodeName, card: CardIndex) -> str | None:
        if node not in self._rules:
            self._rules[node] = self._rule(node)
        rule = self._rules[node]
        if rule is None or card in rule[0]:
            return None
        return rule[1]

    def _rule(self, node: NodeName) -> tuple[frozenset[CardIndex], str] | None:
        """For `node`: None (no live wait), or (the only cards allowed, why the rest are not)."""
        allowed: frozenset[CardIndex] | None = None
        waiting: _Holder | None = None
        for uid, holder in self._pins.get(node, {}).items():
            assert holder.pin is not None
            _, cards, since = holder.pin
            left = since + self._timeout_s - self._now
            if left < 0:
                self.expired[uid] = holder.ref
                continue
            if self.first_wait_ends_in is None or left < self.first_wait_ends_in:
                self.first_wait_ends_in = left
            # A gpu-memory pod may join the waiting pod's card; whole cards never coincide.
            same = frozenset(cards) if self._kind is GpuKind.MEMORY else frozenset()
            allowed = same if allowed is None else allowed & same
            waiting = holder
        if waiting is None or waiting.pin is None:
            return None
        shown = ",".join(map(str, waiting.pin[1]))
        reason = (
            f"held back until pod {waiting.ref} (same request, card {shown}) is assigned "
            f"by the device plugin"
        )
        return (allowed or frozenset(), reason)


_POD_SPEC_FIELDS = (
    "nodeName",
    "schedulerName",
    "containers",
    "initContainers",
    "overhead",
    "nodeSelector",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priority",
    "schedulingGates",
)
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def slim_pod(body: Body) -> dict[str, Any]:
    """The fields of a pod the scheduler and the model read."""
    meta = path(body, "metadata")
    spec = path(body, "spec")
    slim_spec = {key: spec[key] for key in _POD_SPEC_FIELDS if key in spec}
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            slim_spec[key] = [
                {f: c[f] for f in _CONTAINER_FIELDS if f in c}
                for c in spec[key]
                if isinstance(c, dict)
            ]
    return {
        "metadata": {
            key: meta[key]
            for key in (
                "name",
                "namespace",
                "uid",
                "annotations",
                "deletionTimestamp",
                "creationTimestamp",
                "resourceVersion",
            )
            if key in meta
        },
        "spec": slim_spec,
        "status": {"phase": path(body, "status").get("phase")},
    }


def slim_node(body: Body) -> dict[str, Any]:
    """The fields of a node the filters and the inventory read. A real node's status lists
    its images and managed fields: often tens of KiB that no decision needs."""
    meta = path(body, "metadata")
    spec = path(body, "spec")
    status = path(body, "status")
    slim_status = {key: status[key] for key in ("allocatable", "capacity") if key in status}
    if "conditions" in status:
        slim_status["conditions"] = [
            {"type": c.get("type"), "status": c.get("status")}
            for c in sequence(status.get("conditions"))
        ]
    return {
        "metadata": {
            key: meta[key]
            for key in ("name", "uid", "labels", "annotations", "resourceVersion")
            if key in meta
        },
        "spec": {key: spec[key] for key in ("taints", "unschedulable") if key in spec},
        "status": slim_status,
    }


def _fingerprint(body: Body) -> int:
    """A hash of what observe_pod reads of a bound pod, but `gpu-assigned` (which only ever
    lifts the pod's assignment wait)."""
    meta = path(body, "metadata")
    annotations = annotations_of(body)
    return hash(
        repr(
            (
                path(body, "spec").get("nodeName"),
                path(body, "spec").get("containers"),
                path(body, "spec").get("initContainers"),
                path(body, "spec").get("overhead"),
                path(body, "status").get("phase"),
                meta.get("deletionTimestamp"),
                annotations.get(contract.GPU_INDEX),
                annotations.get(contract.GPU_ASSIGNED),
                annotations.get(contract.PREDICATE_TIME),
            )
        )
    )

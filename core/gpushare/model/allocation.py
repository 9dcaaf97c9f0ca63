"""The device plugin's Allocate decision: which pod and container the kubelet is starting,
which card(s) it gets, and what it is told (`device_list`) and given (`limits`).

The kubelet's Allocate names device ids, never the pod. The plugin answers from the pods
bound to its node that the scheduler placed (`gpu-index` set), not yet fully served, not
terminating: a pod already part-served first (the kubelet admits one pod's containers in a
row), then the oldest `predicate-time`; the first whose next GPU container (in the kubelet's
order: init containers, then app containers) asks for exactly the requested device count.
The operator's exactness rule makes that choice safe: two such pods with equal requests on
this node are on the same card. Where the kubelet's pod-resources records can be read
(`KubeletView`), they say which pod it is: the one the kubelet knows none of whose containers
holds a device yet; the operator then lets pods of one request take different cards on the node.
A pod without `gpu-index` is never a candidate, and an annotation naming a card the node
lacks fails the call: no card is ever guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpushare.model import contract
from gpushare.model.admission import units_for
from gpushare.model.annotations import (
    parse_card_indices,
)
from gpushare.model.bound import BoundPod, kubelet_order
from gpushare.model.device_list import (
    ENVVAR_BY_INDEX,
    DeviceListing,
    Mount,
    tell,
)
from gpushare.model.devices import card_of_memory_device
from gpushare.model.errors import GpuShareError
from gpushare.model.inventory import Card, NodeInventory
from gpushare.model.limits import NONE, LimitSettings, framework_limits
from gpushare.model.request import ContainerRequest, GpuKind, PodRequest
from gpushare.model.usage import (
    Allocation,
    PodRef,
    PodUid,
    check_allocation,
)


class NoCandidate(GpuShareError):
    """No pod on the node can be served by this Allocate; the message says why and what to do.

    The message reaches the pod the kubelet was starting, which the call never names: it may
    be of any namespace, so the message names no other pod. `pods` names them, for the
    plugin's log."""

    def __init__(self, message: str, *, pods: Sequence[BoundPod] = ()) -> None:
        super().__init__(message)
        self.pods = tuple(str(p.ref) for p in pods)


class Unservable(NoCandidate):
    """The pod the call is for was found, but what its annotations say cannot be honoured:
    no later watch event makes it servable (the placement annotations cannot change)."""


@dataclass(frozen=True, slots=True)
class KubeletView:
    """The kubelet's pod-resources records (`List`) read during one call, for one resource:
    the pods it knows (namespace, name), and those of them none of whose listed containers
    holds a device of the resource yet (of a name it knows twice, one replacing another, if
    either holds none).

    The kubelet adds a pod to its pod manager just before admitting it, admits one pod at a
    time, and records a container's ids once Allocate has answered; so the pod whose first GPU
    container an Allocate is for is the one it knows whose containers hold none yet (it lists
    sidecars and app containers only, not plain init containers). A pod part-served is being
    admitted container after container: the kubelet knows it."""

    known: frozenset[tuple[str, str]]
    unstarted_pods: frozenset[tuple[str, str]]

    @classmethod
    def listing(cls, entries: Iterable[tuple[str, str, bool]]) -> KubeletView:
        """From the records' entries: (namespace, name, whether any of its listed containers
        holds a device of the resource)."""
        known: set[tuple[str, str]] = set()
        unstarted: set[tuple[str, str]] = set()
        for namespace, name, holds in entries:
            known.add((namespace, name))
            if not holds:
                unstarted.add((namespace, name))
        return cls(frozenset(known), frozenset(unstarted))

    def knows(self, pod: BoundPod) -> bool:
        return _key(pod) in self.known

    def unstarted(self, pod: BoundPod) -> bool:
        """Whether the kubelet knows `pod` and none of its listed containers holds a device
        of the resource yet: it may be admitting the pod's first GPU container now."""
        return _key(pod) in self.unstarted_pods


def _key(pod: BoundPod) -> tuple[str, str]:
    return (pod.ref.namespace, pod.ref.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerGrant:
    """What one Allocate gives one container."""

    pod: PodRef
    container: str
    position: int
    """The container's place in kubelet order; `position + 1` containers are then served."""
    last: bool
    """The pod's last GPU container: the pod is fully served after it."""
    cards: tuple[Card, ...]
    env: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    """CRI annotations for the container (`cdi-annotations`: its CDI devices)."""
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (`cdi-cri`)."""
    problem: str | None = None
    """What in the pod's annotations was not followed, to log."""
    kept: tuple[str, ...] = ()
    """The frameworks' variables the container sets itself (its own win): to report."""
    allocated_mib: int = 0
    """The MiB the container is told it has (gpu-memory), or its cards' (gpu-number)."""


def match_container(
    pods: Iterable[BoundPod],
    served: Mapping[PodUid, int],
    *,
    kind: GpuKind,
    count: int,
    inventory: NodeInventory,
    listing: DeviceListing = ENVVAR_BY_INDEX,
    schedulers: frozenset[str] = frozenset({contract.DEFAULT_SCHEDULER_NAME}),
    limits: LimitSettings | None = None,
    reopened: frozenset[PodUid] = frozenset(),
    kubelet: KubeletView | None = None,
) -> ContainerGrant:
    """The container this Allocate of `count` `kind` devices is for; NoCandidate if none.

    `reopened`: pods this plugin served whose grant the kubelet gave another pod of the same
    request (`swapped_with`): candidates again, whatever their `gpu-assigned` says.

    `kubelet`: what its records say, when they could be read: only a pod it may be admitting
    is a candidate. Either way, if the candidates for a pod's first GPU container hold
    different cards (pods of one request where the operator lets them, as it does where the
    records name pods; a stalled kubelet's pods past the exactness rule's wait), NoCandidate:
    with the records, until they tell them apart (one the kubelet rejected, say); without
    them, the call is refused rather than given a card on a guess.

    `served` counts the GPU containers of each pod already answered by this plugin. Only
    pods that `schedulers` (the names the gpushare operator serves) bound with a Binding are
    candidates: a `gpu-index` on a pod another scheduler bound, or on one created on the node
    directly, was not written by ours, and never wins a card; while such a pod asks for the
    same count, nothing is handed out (`_refuse_if_ambiguous`).
    """
    # A pod this plugin has served every GPU container of is done, whatever its annotations
    # say now: neither a candidate nor a reason to refuse others.
    pods = [
        p for p in pods if p.request is None or served.get(p.ref.uid, 0) < len(p.request.containers)
    ]
    waiting = [
        p
        for p in pods
        if (
            p.waiting
            or (p.ref.uid in reopened and p.active and not p.admitted)
            or (kubelet is not None and _admitted_without_devices(kubelet, p, served))
        )
        and p.scheduler in schedulers
        and p.bound
        and p.request is not None
        and p.request.kind is kind
    ]
    waiting.sort(
        key=lambda p: (
            served.get(p.ref.uid, 0) == 0,
            p.predicate_time is None,
            p.predicate_time or 0,
            p.ref.namespace,
            p.ref.name,
        )
    )
    fitting = [pod for pod in waiting if _next_container(pod, served).amount == count]
    if kubelet is not None:
        fitting = [p for p in fitting if _may_be_admitting(kubelet, p, served)] or [
            p for p in fitting if _guessed_for(kubelet, p, pods, served)
        ]
    if fitting:
        pod = fitting[0]
        position = served.get(pod.ref.uid, 0)
        # A part-served pod is the one the kubelet is admitting (it admits one pod's
        # containers in a row), unless it rejected that pod half-way: the records then show
        # that, unless only plain init containers were served (they are not listed: the
        # call waits while pods on other cards could be the one); without records, its
        # Failed status in the watch is all there is to go by.
        if position == 0 or (kubelet is not None and not _listed(pod, position)):
            _refuse_if_cards_differ(fitting, node=inventory.node, kind=kind, count=count)
        if position == 0:
            _refuse_if_ambiguous(
                pod,
                [p for p in pods if kubelet is None or kubelet.unstarted(p)],
                node=inventory.node,
                kind=kind,
                count=count,
                schedulers=schedulers,
            )
        return container_grant(pod, position, inventory, listing=listing, limits=limits)
    raise _no_candidate(
        pods,
        waiting,
        kind=kind,
        count=count,
        inventory=inventory,
        schedulers=schedulers,
        not_started=kubelet is not None
        and any(_next_container(p, served).amount == count for p in waiting),
    )


def _admitted_without_devices(
    kubelet: KubeletView, pod: BoundPod, served: Mapping[PodUid, int]
) -> bool:
    """An admitted pod that the kubelet asks devices for as its container starts: it admitted
    the pod in the moment before this plugin's devices were listed (just registered), so it
    allocated none then, which its records show; this plugin never served it."""
    return (
        pod.admitted
        and pod.active
        and not pod.assigned
        and pod.gpu_index is not None
        and not served.get(pod.ref.uid, 0)
        and kubelet.unstarted(pod)
    )


def _may_be_admitting(kubelet: KubeletView, pod: BoundPod, served: Mapping[PodUid, int]) -> bool:
    """A pod none of whose containers holds a device yet, or a part-served pod the kubelet
    knows whose served containers hold theirs: it admits one pod's containers in a row and
    records each container's devices once Allocate has answered. A pod it rejected half-way
    (the topology manager refusing its next container, say) holds none there, or is gone
    from the records (Kubernetes 1.34+), and must not take the next pod's call. Plain init
    containers are not in the records: a pod served only those is taken on the kubelet's
    knowing it."""
    position = served.get(pod.ref.uid, 0)
    if not position:
        return kubelet.unstarted(pod)
    return kubelet.knows(pod) and not (_listed(pod, position) and kubelet.unstarted(pod))


def _listed(pod: BoundPod, position: int) -> bool:
    """Whether one of the pod's first `position` GPU containers (kubelet order) is one the
    kubelet's records list: a sidecar or an app container, not a plain init container."""
    assert pod.request is not None  # candidates ask for a GPU
    return any(c.sidecar or not c.init for c in kubelet_order(pod.request)[:position])


def _guessed_for(
    kubelet: KubeletView, pod: BoundPod, pods: Sequence[BoundPod], served: Mapping[PodUid, int]
) -> bool:
    """Whether part-served `pod` was served on a guess (the records could not be read then)
    for another pod of its request, which the records now show holding that grant: the
    kubelet is admitting that one, and goes on with `pod`'s grant (same card, by the
    exactness rule). Only a pod still waiting on the same card counts: one running holds its
    own grant."""
    position = served.get(pod.ref.uid, 0)
    if not position or pod.request is None:
        return False
    listed = _listed(pod, position)
    return any(
        other.ref.uid != pod.ref.uid
        and other.gpu_index == pod.gpu_index
        and other.waiting
        and not served.get(other.ref.uid, 0)
        and other.request is not None
        and other.request.signature == pod.request.signature
        and kubelet.knows(other)
        and not (listed and kubelet.unstarted(other))
        for other in pods
    )


def _next_container(pod: BoundPod, served: Mapping[PodUid, int]) -> ContainerRequest:
    assert pod.request is not None  # candidates ask for a GPU
    return kubelet_order(pod.request)[served.get(pod.ref.uid, 0)]


def _refuse_if_cards_differ(
    candidates: Sequence[BoundPod], *, node: str, kind: GpuKind, count: int
) -> None:
    """NoCandidate while the call may be for pods on different cards: a guess would give one
    pod another's card."""
    cards = {p.gpu_index for p in candidates}
    if len(cards) > 1:
        raise NoCandidate(
            f"{len(candidates)} pods on node {node} asking for {count} {kind.value} hold "
            f"different cards and the kubelet's pod-resources records do not tell which one it "
            f"is starting, so no card is given on a guess; the device plugin's log names them",
            pods=candidates,
        )


def container_grant(
    pod: BoundPod,
    position: int,
    inventory: NodeInventory,
    *,
    listing: DeviceListing = ENVVAR_BY_INDEX,
    limits: LimitSettings | None = None,
) -> ContainerGrant:
    """What the pod's GPU container at `position` (kubelet order) is given: its card(s), env,
    mounts and CDI devices; NoCandidate when its annotations cannot be honoured. Allocate
    serves it; the usage measurement, after a restart, rebuilds from it what was served."""
    if pod.request is None or pod.request.kind is None:
        raise NoCandidate(f"pod {pod.ref} asks for no GPU")
    kind = pod.request.kind
    order = kubelet_order(pod.request)
    container = order[position]
    cards = _cards_of(pod, kind, pod.request, inventory)
    chosen = _container_cards(order, position, cards) if kind is GpuKind.NUMBER else cards
    allocated_mib, problem = (
        _allocated_mib(pod, container, inventory) if kind is GpuKind.MEMORY else (0, None)
    )
    told = tell(kind, allocated_mib, chosen, listing)
    given = NONE
    if limits is not None and kind is GpuKind.MEMORY:
        own = pod.env_names.get(container.name, frozenset())
        given = framework_limits(
            allocated_mib, chosen[0].total_mib, limits, own=own, frameworks=pod.frameworks
        )
        problem = problem or given.note
    return ContainerGrant(
        pod=pod.ref,
        container=container.name,
        position=position,
        last=position + 1 == len(order),
        cards=chosen,
        env={**told.env, **given.env},
        mounts=told.mounts,
        annotations=told.annotations,
        cdi_devices=told.cdi_devices,
        problem=problem,
        kept=given.kept,
        allocated_mib=int(told.env[contract.ENV_GPU_ALLOCATED]),
    )


def swapped_with(
    admitted: BoundPod, pods: Iterable[BoundPod], served: Mapping[PodUid, int]
) -> PodUid | None:
    """The pod whose grant the kubelet gave `admitted`, a pod it just admitted that this plugin
    never served: the call named device ids, not the pod, so the plugin served the oldest pod
    of the same request waiting then, which the kubelet has not admitted yet (same card and
    env, by the exactness rule). That pod is not served after all, and its own call is still
    to come (if the admitted pod is deleted first, its grant must not be lost with it). None
    when no such pod is on the node (one served before this plugin started, say)."""
    if admitted.request is None or admitted.request.kind is None:
        return None
    signature = admitted.request.signature
    partners = [
        p
        for p in pods
        if p.ref.uid != admitted.ref.uid
        and not p.admitted
        and p.active
        and p.request is not None
        and p.request.signature == signature
        and served.get(p.ref.uid, 0) >= len(p.request.containers)
        and p.gpu_index == admitted.gpu_index
    ]
    partners.sort(key=lambda p: (p.predicate_time is None, p.predicate_time or 0))
    return partners[0].ref.uid if partners else None


def _refuse_if_ambiguous(
    candidate: BoundPod,
    pods: Sequence[BoundPod],
    *,
    node: str,
    kind: GpuKind,
    count: int,
    schedulers: frozenset[str],
) -> None:
    """NoCandidate while a pod no scheduler of ours placed, not yet started, asks for the same
    count: the call names device ids, never the pod, so it may be for that pod as well as for
    `candidate`, and a guess would give one pod's card to the other."""
    unplaced = unplaced_pods(pods, kind=kind, schedulers=schedulers, count=count)
    if unplaced:
        raise NoCandidate(
            f"{len(unplaced)} pod(s) on node {node} asking for {count} "
            f"{kind.value} were not placed by the gpushare scheduler (created with "
            f"spec.nodeName, or naming another schedulerName), like one it placed there: the "
            f"kubelet may be starting either, so no card is given on a guess. {_UNPLACED_FIX}",
            pods=[*unplaced, candidate],
        )


def _cards_of(
    pod: BoundPod, kind: GpuKind, request: PodRequest, inventory: NodeInventory
) -> tuple[Card, ...]:
    who = f"pod {pod.ref}"
    try:
        indices = parse_card_indices(pod.gpu_index or "", key=contract.GPU_INDEX, owner=who)
        allocation = Allocation(
            pod=pod.ref,
            node=inventory.node,
            kind=kind,
            cards=indices,
            amount=request.total,
        )
        check_allocation(allocation, inventory)
    except GpuShareError as error:
        raise Unservable(f"refusing to guess a card: {error}") from error
    return tuple(card for index in indices if (card := inventory.card(index)) is not None)


def _allocated_mib(
    pod: BoundPod, container: ContainerRequest, inventory: NodeInventory
) -> tuple[int, str | None]:
    """The MiB a gpu-memory container asked: as recorded at admission, else (a pod created
    before the webhook) its limit in the node's unit. A pod converted to another unit than
    the node's is refused: the kubelet's devices would give it other memory than it asked;
    so is one whose record was edited out of shape."""
    if pod.asked_problem is not None:
        raise Unservable(f"refusing {pod.asked_problem}")
    if pod.asked is None:
        return container.amount * inventory.unit_mib, None
    if pod.asked.unit_mib != inventory.unit_mib:
        raise Unservable(
            f"refusing pod {pod.ref}: its limits are in {pod.asked.unit_mib} MiB units, node "
            f"{inventory.node} runs {inventory.unit_mib} MiB per device"
        )
    mib = pod.asked.mib.get(container.name)
    if mib is None:
        raise Unservable(
            f"refusing pod {pod.ref}: annotation {contract.GPU_MEMORY_MIB} does not name "
            f"container {container.name}; delete the pod and create it again"
        )
    if units_for(mib, inventory.unit_mib) != container.amount:
        # Not what the webhook wrote for this limit (limits cannot change, annotations can):
        # the limit is what the scheduler reserved, so that is what the container is told.
        reserved = container.amount * inventory.unit_mib
        return reserved, (
            f"pod {pod.ref} container {container.name}: annotation {contract.GPU_MEMORY_MIB} "
            f"says {mib} MiB but its limit reserves {container.amount} x "
            f"{inventory.unit_mib} MiB; told {reserved} MiB, the reservation"
        )
    return mib, None


def _container_cards(
    order: Sequence[ContainerRequest], position: int, cards: tuple[Card, ...]
) -> tuple[Card, ...]:
    """A gpu-number container's share of the pod's cards: sidecars, then app containers,
    take consecutive cards; a plain init container takes the cards after the sidecars
    started before it (it runs alone beside them, as the pod total assumes)."""
    sidecars_before = 0
    offset = 0
    running = sum(c.amount for c in order if c.sidecar)
    for index, container in enumerate(order):
        if index == position:
            if container.init and not container.sidecar:
                return cards[sidecars_before : sidecars_before + container.amount]
            start = sidecars_before if container.sidecar else running + offset
            return cards[start : start + container.amount]
        if container.sidecar:
            sidecars_before += container.amount
        elif not container.init:
            offset += container.amount
    raise NoCandidate(f"container position {position} is past the pod's GPU containers")


def unplaced_pods(
    pods: Iterable[BoundPod], *, kind: GpuKind, schedulers: frozenset[str], count: int = 0
) -> list[BoundPod]:
    """Pods on the node, not yet served, that ask for `kind` but that no scheduler of ours
    placed (no gpu-index, another scheduler, or created with spec.nodeName): never served.
    With `count`, only those with a container of that many devices."""
    return [
        p
        for p in pods
        if p.active
        and not p.assigned
        and not p.admitted
        and (p.gpu_index is None or p.scheduler not in schedulers or not p.bound)
        and p.request is not None
        and p.request.kind is kind
        and (not count or any(c.amount == count for c in p.request.containers))
    ]


_UNPLACED_FIX = (
    f"If the pod being started is one of them, delete it and create it with "
    f"spec.schedulerName set to one the operator serves (default "
    f"{contract.DEFAULT_SCHEDULER_NAME!r}) and no spec.nodeName; if it was placed by gpushare, "
    f"it fails with this message and its controller creates it again. The device plugin's log "
    f"names the pods"
)


def _no_candidate(
    pods: Sequence[BoundPod],
    waiting: Sequence[BoundPod],
    *,
    kind: GpuKind,
    count: int,
    inventory: NodeInventory,
    schedulers: frozenset[str],
    not_started: bool = False,
) -> NoCandidate:
    """Why no pod matched. `not_started`: pods of that count wait, but the kubelet's records
    say it is starting none of them."""
    head = f"no pod bound to node {inventory.node} waits for a container of {count} {kind.value}"
    unplaced = unplaced_pods(pods, kind=kind, schedulers=schedulers)
    if unplaced:
        return NoCandidate(
            f"{head} placed by the gpushare scheduler: {len(unplaced)} pod(s) there ask for "
            f"{kind.value} without {contract.GPU_INDEX} from the gpushare scheduler, so no card "
            f"was chosen for them. {_UNPLACED_FIX}",
            pods=unplaced,
        )
    if not_started:
        return NoCandidate(
            f"the kubelet of node {inventory.node} is starting none of the pods placed there "
            f"that wait for {count} {kind.value}, by its pod-resources records: the pod it "
            f"starts is not in the device plugin's watch yet, or was not placed by the gpushare "
            f"scheduler (check its spec.schedulerName and {contract.GPU_INDEX})",
            pods=waiting,
        )
    if waiting:
        return NoCandidate(
            f"{head}; the {len(waiting)} pod(s) waiting for {kind.value} here ask for other "
            f"amounts. The pod being started was not placed by the gpushare scheduler or has "
            f"finished its GPU containers: check its spec.schedulerName and {contract.GPU_INDEX}",
            pods=waiting,
        )
    return NoCandidate(
        f"{head}. A pod that uses {kind.value} must be placed by the gpushare scheduler (its "
        f"spec.schedulerName must be one the operator serves, default "
        f"{contract.DEFAULT_SCHEDULER_NAME!r}), which writes {contract.GPU_INDEX}"
    )


def preferred_device_ids(
    grant: ContainerGrant,
    kind: GpuKind,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """The ids to steer the kubelet to: those it must keep, then ids on the granted cards,
    then (only if those run short) any other available ids, so the kubelet's own records
    name the card the pod really got."""
    chosen = list(dict.fromkeys(must_include))
    taken = set(chosen)
    if kind is GpuKind.MEMORY:
        wanted = {card.index for card in grant.cards}
        on_card = [d for d in available if card_of_memory_device(d) in wanted]
        on_card.sort(key=_memory_unit_order)
    else:
        uuids = [card.uuid for card in grant.cards]
        on_card = [d for d in uuids if d in set(available)] if uuids else []
    for device in [*on_card, *available]:
        if len(chosen) >= size:
            break
        if device not in taken:
            chosen.append(device)
            taken.add(device)
    return chosen[:size] if len(chosen) > size else chosen


def _memory_unit_order(device_id: str) -> tuple[int, int]:
    card, _, unit = device_id.partition("-")
    return int(card), int(unit)

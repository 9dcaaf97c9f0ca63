"""What the CLI reports, built from the model: the cards of each GPU node (`inspect`), and
where a pod is, or would go now, and why not (`explain`, `simulate`).

The answers come from the operator's own cache and decision
(`gpushare_operator.scheduling.decision.plan`) fed with what `read` listed, so the CLI says
what the scheduler would. Reports are typed; `render` writes them as text, JSON or YAML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeAlias

from gpushare.model import (
    CardIndex,
    GpuKind,
    InventorySource,
    Ledger,
    NodeCheck,
    NodeName,
    NodeUsage,
    NodeVerdict,
    Placement,
    PodRef,
    PodUid,
    Policy,
    contract,
    diagnose,
)
from gpushare.model.bodies import Body, annotations_of, path, text
from gpushare.model.defrag import DefragPlan
from gpushare.model.filters import PodNeeds, pod_needs
from gpushare.model.gangs import GroupSpec, group_of
from gpushare.model.measured import measured_of
from gpushare.model.preemption import NodeCheckWithout, Preemption
from gpushare.model.usage import CardUsage
from gpushare.model.volumes import PodVolumes, claim_facts, class_facts, volume_facts
from gpushare_cli.errors import CliError
from gpushare_cli.partial import is_stand_in, stands_for
from gpushare_cli.read import Cluster
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import Plan, Refusal, node_check_of, plan
from gpushare_operator.scheduling.defrag import defrag_plan
from gpushare_operator.scheduling.gangs import GangBook, decide_gang
from gpushare_operator.scheduling.podinfo import Demand, PodInfo
from gpushare_operator.scheduling.preemption import Room, make_room

BLIND = (
    "neither nodes nor GPUNodes are visible to you, so the cards cannot be known; ask for "
    "read access to gpunodes.gpushare.io (cluster-wide)"
)


class _UncheckedNodes(SchedulerCache):
    """The cache of a user who may not read Nodes: the stand-ins made from the GPUNodes
    (`partial.stand_in_nodes`) pass every node filter, since nothing is known to check."""

    def node_check(self, needs: PodNeeds, volumes: PodVolumes | None = None) -> NodeCheck:
        return lambda node: None

    def node_check_without(
        self, needs: PodNeeds, volumes: PodVolumes | None = None
    ) -> NodeCheckWithout:
        return lambda node, gone: None


def build_cache(cluster: Cluster) -> SchedulerCache:
    kind = SchedulerCache if cluster.nodes_checked else _UncheckedNodes
    cache = kind(config=lambda: cluster.config)
    for node in cluster.nodes:
        cache.observe_node(node)
    for resource in cluster.gpunodes:
        cache.observe_gpunode(resource)
    for pod in cluster.pods:
        cache.observe_pod(PodInfo.parse(pod))
    for budget in cluster.budgets:
        cache.observe_budget(budget)
    if cluster.volumes is not None:
        book = cache.volumes
        for claim in cluster.volumes.claims:
            book.observe_claim(claim_facts(claim))
        for volume in cluster.volumes.volumes:
            book.observe_volume(volume_facts(volume))
        for storage in cluster.volumes.classes:
            book.observe_class(class_facts(storage))
        book.listed = True
    return cache


# -- inspect ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class PodOnCard:
    namespace: str
    name: str
    mib: int
    """What it holds on the card: its gpu-memory, or the whole card for a gpu-number pod."""
    measured_mib: int | None = None
    """What its processes hold there, as the device plugin last measured (None: unmeasured)."""
    granted_mib: int | None = None
    """What its measured containers were granted there (the MiB they asked, not the devices
    reserved); None: unmeasured, or not known."""
    over: bool = False
    """A container of it holds more there than it was granted, as the operator judges it (each
    container against the MiB it asked)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CardReport:
    index: CardIndex
    model: str
    uuid: str
    healthy: bool
    used_mib: int
    total_mib: int
    pods: tuple[PodOnCard, ...]
    """The pods holding the card, by namespace and name."""
    measured_mib: int | None = None
    """What the processes on the card hold, measured (None: the plugin has not measured)."""
    others_mib: int = 0
    """Held by pods this user may not see (other namespaces'), as the GPUNode's status
    counts it."""
    others: tuple[str, ...] = ()
    """Those pods, `namespace/name`, as the GPUNode's status lists them."""

    @property
    def pod_count(self) -> int:
        return len(self.pods) + len(self.others)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeReport:
    node: NodeName
    source: InventorySource
    unit_mib: int
    cards: tuple[CardReport, ...]
    """By index."""
    measured_at: str | None = None
    """When the device plugin last measured (RFC 3339); None: it has not."""
    strategy: str | None = None
    """How its device plugin tells containers their cards (GPUNode `spec.deviceListStrategy`);
    None: a plugin that does not say."""

    @property
    def used_mib(self) -> int:
        return sum(card.used_mib for card in self.cards)

    @property
    def total_mib(self) -> int:
        return sum(card.total_mib for card in self.cards)


def inspect(cluster: Cluster, node: str | None, *, namespace: str | None) -> list[NodeReport]:
    """Every GPU node by name, or only `node`; CliError when it is unknown or has no GPU.
    The cards' pods listed: those of `namespace`, or of every namespace (None); the memory
    counts every pod."""
    if not cluster.sees_cards:
        raise CliError(BLIND)
    ledger = build_cache(cluster).ledger
    gpunodes = _gpunodes_by_name(cluster)
    names = sorted(ledger.nodes())
    if node is not None:
        wanted = NodeName(node)
        if wanted not in ledger.nodes():
            if wanted not in ledger.nodes_without_gpu():
                raise CliError(f"node {node} not found")
            problem = ledger.nodes_without_gpu()[wanted]
            raise CliError(f"node {node} has no GPU" + (f": {problem}" if problem else ""))
        names = [wanted]
    stand_ins = _stand_ins(cluster)
    return [
        _node_report(ledger, ledger.nodes()[name], namespace, gpunodes.get(name), stand_ins)
        for name in names
    ]


def _node_report(
    ledger: Ledger,
    usage: NodeUsage,
    namespace: str | None,
    gpunode: Body | None,
    stand_ins: Mapping[PodUid, Body],
) -> NodeReport:
    unit = usage.inventory.unit_mib
    measured = measured_of(gpunode) if gpunode is not None else None

    def used_by(index: CardIndex, pod: PodRef | None) -> int | None:
        if measured is None:
            return None
        uses = [u for u in measured.containers if u.card == index]
        if pod is None:
            return sum(u.used_mib for u in uses) + measured.unmapped_mib.get(index, 0)
        return sum(u.used_mib for u in uses if u.pod.uid == pod.uid)

    def judged(index: CardIndex, pod: PodRef) -> tuple[int | None, bool]:
        """What its measured containers were granted there, and whether one is over it."""
        uses = [
            u
            for u in (measured.containers if measured is not None else ())
            if u.card == index and u.pod.uid == pod.uid
        ]
        granted = [u.granted_mib for u in uses]
        known = sum(g for g in granted if g is not None) if uses and None not in granted else None
        return known, any(u.over for u in uses)

    def card(index: CardIndex, held: CardUsage) -> CardReport:
        others = [stand_ins[uid] for uid in held.pods if uid in stand_ins]
        return CardReport(
            index=index,
            model=held.card.model or "",
            uuid=held.card.uuid or "",
            healthy=held.card.healthy,
            used_mib=held.allocated * unit,
            total_mib=held.card.memory * unit,
            pods=tuple(
                sorted(
                    (
                        _on_card(
                            ledger, uid, pod, held, unit, used_by(index, pod), judged(index, pod)
                        )
                        for uid, pod in held.pods.items()
                        if uid not in stand_ins and namespace in (None, pod.namespace)
                    ),
                    key=lambda p: (p.namespace, p.name),
                )
            ),
            measured_mib=used_by(index, None),
            others_mib=sum(
                _on_card(ledger, uid, pod, held, unit, None).mib
                for uid, pod in held.pods.items()
                if uid in stand_ins
            ),
            others=tuple(name for body in others for name in stands_for(body)),
        )

    return NodeReport(
        node=usage.inventory.node,
        source=usage.inventory.source,
        unit_mib=unit,
        cards=tuple(card(index, held) for index, held in sorted(usage.cards.items())),
        measured_at=measured.at if measured is not None else None,
        strategy=(
            text(path(gpunode, "spec").get("deviceListStrategy")) if gpunode is not None else None
        ),
    )


def _gpunodes_by_name(cluster: Cluster) -> dict[str, Body]:
    return {text(path(r, "metadata").get("name")) or "": r for r in cluster.gpunodes}


def _stand_ins(cluster: Cluster) -> dict[PodUid, Body]:
    """The stand-in pods (`partial`) by uid."""
    return {
        PodUid(text(path(pod, "metadata").get("uid")) or ""): pod
        for pod in cluster.pods
        if is_stand_in(pod)
    }


def _on_card(  # noqa: PLR0917 - one private helper
    ledger: Ledger,
    uid: PodUid,
    pod: PodRef,
    held: CardUsage,
    unit: int,
    measured: int | None,
    judged: tuple[int | None, bool] = (None, False),
) -> PodOnCard:
    allocation = ledger.allocation(uid)
    units = held.card.memory
    if allocation is not None and allocation.kind is GpuKind.MEMORY:
        units = allocation.amount
    return PodOnCard(
        namespace=pod.namespace,
        name=pod.name,
        mib=units * unit,
        measured_mib=measured,
        granted_mib=judged[0],
        over=judged[1],
    )


# -- explain and simulate --------------------------------------------------------------------


class State(StrEnum):
    BOUND = "bound"
    PLACEABLE = "placeable now"
    WOULD_BE_PLACED = "would be placed now"
    UNPLACEABLE = "cannot be placed now"
    NEVER = "cannot be placed on any node, even with no other pod"


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """The pod has a node: where, and whether the device plugin has served it."""

    node: str
    card: str | None
    """The pod's gpu-index annotation, as written."""
    assigned: bool
    phase: str | None

    @property
    def state(self) -> State:
        return State.BOUND


@dataclass(frozen=True, kw_only=True, slots=True)
class Placeable:
    """Where the scheduler would put the pod now."""

    policy: Policy
    node: NodeName
    placement: Placement | None
    """None for a pod that asks for no GPU."""
    simulated: bool

    @property
    def state(self) -> State:
        return State.WOULD_BE_PLACED if self.simulated else State.PLACEABLE


@dataclass(frozen=True, kw_only=True, slots=True)
class Unplaceable:
    """Why the pod fits nowhere now, node by node (no verdicts when its request cannot be
    read or it asks for no GPU)."""

    policy: Policy
    reason: str
    nodes: tuple[NodeVerdict, ...]
    never: bool
    """It would not fit even if no other pod were running: waiting will not help."""
    preemption: Preemption | None = None
    """What the operator would evict to make room for it now (preemption on)."""

    @property
    def state(self) -> State:
        return State.NEVER if self.never else State.UNPLACEABLE


Outcome: TypeAlias = Bound | Placeable | Unplaceable


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    pod: str
    """namespace/name"""
    scheduler_name: str
    outcome: Outcome
    note: str | None = None
    """Why the operator will not place the pod at all (another scheduler's)."""
    pod_scheduled: Mapping[str, Any] | None = None
    """The pod's PodScheduled condition: its message is what the scheduler said last."""
    leader: str | None = None
    """The operator replica whose published configuration the decision used; None when no
    operator leads (this shell's environment and the live GPUShareConfig were used)."""
    group: str | None = None
    """The gang the pod belongs to, and its members now (its PodGroup's verdict is the
    pod's)."""
    leader_known: bool = True
    """Whether an operator leads is known (its Lease was found and read): `leader` None
    means none does."""
    node_reports: Mapping[str, NodeReport] = field(default_factory=dict)
    """The cards of the nodes the outcome names (its node, or every node it does not fit),
    as `inspect` reports them: `-o wide` shows them."""


def find_pod(cluster: Cluster, name: str, namespace: str | None) -> Body:
    """The pod `name` in `namespace`; in any namespace when None (CliError unless exactly
    one has it)."""
    found = [
        pod
        for pod in cluster.pods
        if not is_stand_in(pod)
        and (meta := path(pod, "metadata")).get("name") == name
        and namespace in (None, meta.get("namespace"))
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        where = "in any namespace" if namespace is None else f"in namespace {namespace}"
        raise CliError(f"pod {name} not found {where}")
    spaces = ", ".join(sorted(str(path(p, "metadata").get("namespace")) for p in found))
    raise CliError(f"pod {name} is in several namespaces ({spaces}): name one with -n")


def explain(cluster: Cluster, pod: Body, *, simulated: bool = False) -> Explanation:
    """Where `pod` is, or would go now, and why; card by card when it cannot go anywhere."""
    info = PodInfo.parse(pod)
    name = f"{info.ref.namespace or 'default'}/{info.ref.name or '<unnamed>'}"
    scheduler = info.scheduler_name or "default-scheduler"
    cache = build_cache(cluster)
    gangs, group = _gang_of(cluster, cache, info)
    if not simulated and info.node:
        bound = Bound(
            node=info.node,
            card=annotations_of(pod).get(contract.GPU_INDEX),
            assigned=info.assigned,
            phase=text(path(pod, "status").get("phase")),
        )
        return Explanation(
            pod=name,
            scheduler_name=scheduler,
            outcome=bound,
            group=group,
            node_reports=_reports(cluster, cache, [info.node]),
        )
    if not cluster.sees_cards:
        said = (_pod_scheduled(pod) or {}).get("message") if not simulated else None
        raise CliError(
            f"pod {name} is not bound"
            + (f" (the scheduler says: {said})" if said else "")
            + f"; where it could go cannot be worked out: {BLIND}"
        )
    config = cluster.config
    note = None
    if scheduler not in config.scheduler_names:
        note = _not_served(info, scheduler, sorted(config.scheduler_names))
    condition = None if simulated else _pod_scheduled(pod)
    decided = _decide(cache, gangs, info, config, simulated)
    outcome: Outcome
    if isinstance(decided, Plan):
        outcome = Placeable(
            policy=config.policy,
            node=decided.node,
            placement=decided.placement,
            simulated=simulated,
        )
    else:
        on_empty = plan(build_cache(replace(cluster, pods=[])), info, config.policy)
        reason, preemption = decided.message, None
        spec = gangs.spec(info.group) if info.group is not None else None
        single = spec is None or (isinstance(spec, GroupSpec) and not spec.is_gang)
        nominated = text(path(pod, "status").get("nominatedNodeName"))
        if nominated and not simulated:
            # It preempted already: its victims are leaving (a new choice would pass them by).
            reason = f"{reason}; nominated to node {nominated}: waiting for the pods it preempted"
        elif config.preemption and single:  # as the operator: single pods preempt
            room = make_room(
                cache, _all_gangs(cluster), info, decided, priority=gangs.priority_of(info)
            )
            if isinstance(room, Room):
                reason, preemption = room.refusal.message, room.preemption
            else:
                reason = room.message
        outcome = Unplaceable(
            policy=config.policy,
            reason=reason,
            nodes=_verdicts(cache, info),
            never=isinstance(on_empty, Refusal),
            preemption=preemption,
        )
    named = [outcome.node] if isinstance(outcome, Placeable) else [v.node for v in outcome.nodes]
    return Explanation(
        pod=name,
        scheduler_name=scheduler,
        outcome=outcome,
        note=note,
        pod_scheduled=condition,
        leader=cluster.leader,
        group=group,
        leader_known=cluster.leader_known,
        node_reports=_reports(cluster, cache, named),
    )


def _reports(
    cluster: Cluster, cache: SchedulerCache, names: Sequence[str]
) -> dict[str, NodeReport]:
    """The GPU nodes among `names`, as `inspect` reports them (every namespace's pods)."""
    usages = cache.ledger.nodes()
    gpunodes = _gpunodes_by_name(cluster)
    stand_ins = _stand_ins(cluster)
    return {
        name: _node_report(cache.ledger, usage, None, gpunodes.get(name), stand_ins)
        for name in names
        if (usage := usages.get(NodeName(name))) is not None
    }


def _gang_of(cluster: Cluster, cache: SchedulerCache, pod: PodInfo) -> tuple[GangBook, str | None]:
    """The PodGroups and their members, and a line on the pod's group (None: it names none)."""
    book = GangBook()
    if pod.group is None:
        return book, None
    for api, item in cluster.podgroups:
        book.observe_group(api, item)
    for body in cluster.pods:
        if group_of(body) == pod.group:  # parse only the group's members
            book.observe_member(PodInfo.parse(body))
    spec = book.spec(pod.group)
    if spec is None:
        return book, (
            f"names {pod.group} ({pod.group.api.group}), which does not exist (or its CRD is "
            f"not installed, or you may not list it): the operator places it as a single pod"
        )
    if isinstance(spec, str):
        return book, spec
    members = book.counts(spec.key, cache)
    return book, (
        f"{spec.key} ({spec.key.api.group}): minMember {spec.min_member}; its pods now: "
        f"{members.bound} bound ({members.running} running), {members.pending} pending"
    )


def _all_gangs(cluster: Cluster) -> GangBook:
    """Every PodGroup and its members: preemption weighs what evicting a member costs."""
    book = GangBook()
    for api, item in cluster.podgroups:
        book.observe_group(api, item)
    for body in cluster.pods:
        if group_of(body) is not None:
            book.observe_member(PodInfo.parse(body))
    return book


def defrag(cluster: Cluster) -> DefragPlan:
    """The fewest moves after which the pods waiting now fit, as the operator plans them;
    each moved pod's replacement must pass that pod's own node filters where it lands."""
    if not cluster.sees_cards:
        raise CliError(BLIND)
    cache = build_cache(cluster)
    needs = {
        PodUid(text(path(body, "metadata").get("uid")) or ""): pod_needs(body)
        for body in cluster.pods
    }

    def moved_check(uid: PodUid) -> NodeCheck | None:
        return cache.node_check(needs[uid]) if uid in needs else None

    return defrag_plan(cache, _all_gangs(cluster), cluster.config.policy, moved_check=moved_check)


def _decide(
    cache: SchedulerCache, gangs: GangBook, pod: PodInfo, config: OperatorConfig, simulated: bool
) -> Plan | Refusal:
    """What the scheduler decides for the pod: for a gang's member, for its whole gang."""
    spec = gangs.spec(pod.group) if pod.group is not None and not simulated else None
    if isinstance(spec, str):
        return Refusal(spec)
    if spec is None or not spec.is_gang:
        return plan(cache, pod, config.policy)
    gang = decide_gang(
        cache, gangs, spec, config.policy, timeout_s=config.gang_timeout_s, waited={}
    )
    decisions: list[tuple[PodInfo, Plan | Refusal]] = [*gang.placed, *gang.refused]
    for member, decided in decisions:
        if member.uid == pod.uid:
            return decided
    return Refusal(f"{spec.key}: this pod is not one of its pending members")


def _not_served(pod: PodInfo, scheduler: str, served: list[str]) -> str:
    """What really happens to a pod that names a scheduler the operator does not serve."""
    said = (
        f"spec.schedulerName {scheduler!r} is not one the gpushare operator serves "
        f"({', '.join(served)}): it will not place this pod"
    )
    if not isinstance(pod.demand, Demand) or pod.demand.request.kind is None:
        return f"{said}; {scheduler} does, if it runs"
    return (
        f"{said}. {scheduler}, if it runs, binds it with no card chosen, and the gpushare "
        f"device plugin then refuses to start it (the pod fails with UnexpectedAdmissionError): "
        f"create it with spec.schedulerName: {served[0]}"
    )


def _pod_scheduled(pod: Body) -> Mapping[str, Any] | None:
    found = None
    for condition in path(pod, "status").get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
            found = condition
    return found


def _verdicts(cache: SchedulerCache, pod: PodInfo) -> tuple[NodeVerdict, ...]:
    if not isinstance(pod.demand, Demand) or pod.demand.request.kind is None:
        return ()
    request = pod.demand.request
    return diagnose(
        cache.ledger,
        request,
        node_check_of(cache, pod.demand),
        cache.card_check(request, pod.ref.namespace),
    ).nodes

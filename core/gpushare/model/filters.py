"""The node filters a scheduler must apply before the GPU fit, as kube-scheduler applies them.

Order and wording follow kube-scheduler's plugins (NodeUnschedulable, TaintToleration,
NodeAffinity, NodeResourcesFit), plus readiness, which kube-scheduler leaves to the
not-ready taint of the node lifecycle controller. Each check returns None or the reason,
worded like kube-scheduler's so `kubectl describe pod` reads familiarly.

Constraints this scheduler does not implement (required inter-pod affinity and anti-affinity,
hard topology spread) are not ignored: `unsupported()` names them and the pod is reported
Unschedulable with that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpushare.model import contract
from gpushare.model.bodies import Body, describe, mapping, path, sequence, text
from gpushare.model.diagnosis import Diagnosis, NodeProblem, NodeVerdict
from gpushare.model.errors import GpuShareError
from gpushare.model.inventory import NodeName
from gpushare.model.request import NO_GPU
from gpushare.model.resources import HOST_PORT, PODS, pod_requests, resource_list

_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_GPU_RESOURCES = frozenset({contract.GPU_MEMORY, contract.GPU_NUMBER})
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


@dataclass(frozen=True, kw_only=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeFacts:
    """What the filters read from a Node."""

    name: str
    ready: bool
    unschedulable: bool
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, int]
    problem: str | None = None
    """Set when the node's allocatable cannot be read: the node is then filtered out."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PodNeeds:
    """What the filters read from a Pod."""

    requests: Mapping[str, int]
    tolerations: tuple[Body, ...]
    node_selector: Mapping[str, str]
    node_affinity: tuple[Body, ...]
    """Required nodeSelectorTerms (ORed); empty when the pod has none."""


def node_facts(node: Body) -> NodeFacts:
    meta = path(node, "metadata")
    spec = path(node, "spec")
    conditions = sequence(path(node, "status").get("conditions"))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = tuple(
        Taint(
            key=text(t.get("key")) or "",
            value=text(t.get("value")) or "",
            effect=text(t.get("effect")) or "",
        )
        for t in sequence(spec.get("taints"))
    )
    problem = None
    try:
        allocatable = resource_list(
            path(node, "status").get("allocatable"), owner=f"{describe(node, 'node')} allocatable"
        )
    except GpuShareError as error:
        allocatable, problem = {}, str(error)
    labels = {k: v for k, v in mapping(meta.get("labels")).items() if isinstance(v, str)}
    return NodeFacts(
        name=text(meta.get("name")) or "",
        ready=ready,
        unschedulable=spec.get("unschedulable") is True,
        labels=labels,
        taints=taints,
        allocatable=allocatable,
        problem=problem,
    )


def pod_needs(pod: Body) -> PodNeeds:
    """Raises InvalidQuantity when a resource quantity of the pod cannot be read."""
    spec = path(pod, "spec")
    selector = {k: v for k, v in mapping(spec.get("nodeSelector")).items() if isinstance(v, str)}
    required = path(
        spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return PodNeeds(
        requests=pod_requests(pod),
        tolerations=tuple(sequence(spec.get("tolerations"))),
        node_selector=selector,
        node_affinity=tuple(sequence(required.get("nodeSelectorTerms"))),
    )


def unsupported(pod: Body) -> str | None:
    """The first scheduling constraint of `pod` this scheduler does not implement, if any."""
    spec = path(pod, "spec")
    affinity = path(spec, "affinity")
    for kind, label in (("podAffinity", "pod affinity"), ("podAntiAffinity", "pod anti-affinity")):
        if sequence(path(affinity, kind).get("requiredDuringSchedulingIgnoredDuringExecution")):
            return (
                f"required {label} is not supported by the gpushare scheduler; use "
                f"preferred{label[0].upper()}{label[1:].replace(' ', '')} terms or another "
                f"scheduler"
            )
    for constraint in sequence(spec.get("topologySpreadConstraints")):
        if constraint.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            return (
                "topologySpreadConstraints with whenUnsatisfiable: DoNotSchedule are not "
                "supported by the gpushare scheduler; use ScheduleAnyway or another "
                "scheduler"
            )
    return None


def node_reason(needs: PodNeeds, node: NodeFacts, requested: Mapping[str, int]) -> str | None:
    """Why `node` cannot take the pod, or None. `requested` sums the pods already on it."""
    if node.problem:
        return node.problem
    if not node.ready:
        return "node(s) were not ready"
    if node.unschedulable and not _tolerates(
        needs.tolerations, Taint(key=UNSCHEDULABLE_TAINT, value="", effect="NoSchedule")
    ):
        return "node(s) were unschedulable"
    for taint in node.taints:
        if taint.effect in _HARD_EFFECTS and not _tolerates(needs.tolerations, taint):
            shown = f"{taint.key}: {taint.value}" if taint.value else taint.key
            return f"node(s) had untolerated taint {{{shown}}}"
    if not _matches_selector(needs, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return _insufficient(needs.requests, node.allocatable, requested)


def _insufficient(
    needs: Mapping[str, int], allocatable: Mapping[str, int], requested: Mapping[str, int]
) -> str | None:
    # kube-scheduler's NodePorts, before NodeResourcesFit.
    if any(name.startswith(HOST_PORT) and requested.get(name, 0) for name in needs):
        return "node(s) didn't have free ports for the requested pod ports"
    for name in sorted(needs):
        if name in _GPU_RESOURCES or name.startswith(HOST_PORT):
            continue  # the card fit counts GPUs, card by card, with better reasons
        free = allocatable.get(name, 0) - requested.get(name, 0)
        if needs[name] > free:
            return "Too many pods" if name == PODS else f"Insufficient {name}"
    return None


def _tolerates(tolerations: tuple[Body, ...], taint: Taint) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.key:
                return True
        elif (
            operator == "Equal"
            and key == taint.key
            and (toleration.get("value") or "") == taint.value
        ):
            return True
    return False


def _matches_selector(needs: PodNeeds, node: NodeFacts) -> bool:
    if any(node.labels.get(key) != value for key, value in needs.node_selector.items()):
        return False
    if not needs.node_affinity:
        return True
    return any(term_matches(term, node) for term in needs.node_affinity)


def term_matches(term: Body, node: NodeFacts) -> bool:
    """A NodeSelectorTerm: all its expressions and fields match the node."""
    expressions = sequence(term.get("matchExpressions"))
    fields = sequence(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node (kube-scheduler's rule)
    return all(requirement_matches(e, node.labels) for e in expressions) and all(
        requirement_matches(f, {"metadata.name": node.name}) for f in fields
    )


def requirement_matches(expression: Body, labels: Mapping[str, str]) -> bool:
    """A NodeSelectorRequirement (or a LabelSelectorRequirement, the same but for Gt and Lt);
    unknown operators and malformed values match nothing."""
    key = text(expression.get("key")) or ""
    operator = expression.get("operator")
    values = [v for v in (expression.get("values") or []) if isinstance(v, str)]
    value = labels.get(key)
    if operator in ("Gt", "Lt"):
        return _compare(value, values, greater=operator == "Gt")
    matches = {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }
    return matches.get(str(operator), False)


def _compare(value: str | None, values: list[str], *, greater: bool) -> bool:
    if value is None or len(values) != 1:
        return False
    try:
        have, bound = int(value), int(values[0])
    except ValueError:
        return False
    return have > bound if greater else have < bound


def choose_node(
    nodes: Mapping[NodeName, NodeFacts],
    requested: Callable[[NodeName], Mapping[str, int]],
    needs: PodNeeds,
    node_check: Callable[[NodeName], str | None],
) -> NodeName | Diagnosis:
    """A node for a pod that asks for no GPU: the least allocated (cpu and memory, as
    kube-scheduler's default LeastAllocated score) among those that pass `node_check`."""
    best: tuple[float, NodeName] | None = None
    verdicts = []
    for name, facts in nodes.items():
        reason = node_check(name)
        if reason is not None:
            verdicts.append(NodeVerdict(node=name, problem=NodeProblem.FILTERED, detail=reason))
            continue
        used = requested(name)
        shares = [
            (used.get(resource, 0) + needs.requests.get(resource, 0)) / facts.allocatable[resource]
            for resource in ("cpu", "memory")
            if facts.allocatable.get(resource)
        ]
        score = sum(shares) / len(shares) if shares else 0.0
        if best is None or (score, name) < best:
            best = (score, name)
    if best is not None:
        return best[1]
    return Diagnosis(request=NO_GPU, nodes=tuple(sorted(verdicts, key=lambda v: v.node)))

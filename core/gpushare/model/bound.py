"""A pod bound to the device plugin's node, as the plugin reads it from each watch event: its
request, its placement, whether the kubelet admitted it, and what its containers set
themselves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare.model import contract
from gpushare.model.admission import MemoryAsked, memory_asked
from gpushare.model.annotations import gpu_assigned, predicate_time_ns
from gpushare.model.bodies import Body, annotations_of, describe, path, sequence, text
from gpushare.model.errors import GpuShareError
from gpushare.model.limits import Framework, pod_frameworks
from gpushare.model.request import ContainerRequest, GpuKind, PodRequest, gpu_request
from gpushare.model.usage import FINISHED_PHASES, PodRef, pod_ref


@dataclass(frozen=True, kw_only=True, slots=True)
class BoundPod:
    """A pod bound to the plugin's node, read once per watch event."""

    ref: PodRef
    active: bool
    """Neither terminating nor finished."""
    assigned: bool
    """`gpu-assigned` is exactly "true" (`annotations.gpu_assigned`)."""
    predicate_time: int | None
    request: PodRequest | None
    """None when the request cannot be read (`problem` says why)."""
    gpu_index: str | None
    """The raw `gpu-index` annotation; None when absent."""
    scheduler: str
    bound: bool = True
    """Bound by a scheduler's Binding (the apiserver then sets PodScheduled=True), not created
    on the node directly with spec.nodeName, which no scheduler ever saw."""
    problem: str | None = None
    asked: MemoryAsked | None = None
    """What the admission webhook recorded for a gpu-memory pod: the unit and each container's
    MiB."""
    asked_problem: str | None = None
    """Why a gpu-memory pod's record of what it asked cannot be read (edited out of shape):
    Allocate refuses it with this."""
    env_names: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each container's own env names (its values win over what Allocate returns)."""
    container_ids: Mapping[str, str] = field(default_factory=dict)
    """Each started container's runtime id (without `containerd://`) -> its name; ephemeral
    containers (`kubectl debug`) too: they are given no card, so what they hold on one is
    theirs to answer for."""
    frameworks: frozenset[Framework] | None = None
    """The frameworks whose limits its containers get, as it names them in
    `gpushare.io/framework-limits`; None: the node's."""
    admitted: bool = False
    """The kubelet has admitted it (its status lists containers, or it is past Pending): it
    allocates every container's devices when it admits a pod, so an admitted pod is never
    the one an Allocate is for, whatever its annotations say. (It may have been admitted with
    the grant served under another pod's name: `swapped_with` moves the record.)"""

    @property
    def waiting(self) -> bool:
        """Has a placement and is not yet served (whose placement: see `match_container`)."""
        return (
            self.active
            and not self.assigned
            and not self.admitted
            and self.gpu_index is not None
            and self.request is not None
            and self.request.kind is not None
        )


def bound_pod(pod: Body) -> BoundPod:
    meta = path(pod, "metadata")
    annotations = annotations_of(pod)
    request: PodRequest | None
    problem = asked_problem = None
    asked = None
    try:
        request = gpu_request(pod)
    except GpuShareError as error:
        request, problem = None, str(error)
    if request is not None and request.kind is GpuKind.MEMORY:
        # Read for gpu-memory pods alone, as the operator reads them: on a whole-card pod the
        # memory annotations mean nothing, whatever stray value they hold.
        try:
            asked = memory_asked(annotations, owner=describe(pod, "pod"))
        except GpuShareError as error:
            asked_problem = str(error)
    status = path(pod, "status")
    phase = text(status.get("phase"))
    spec = path(pod, "spec")
    return BoundPod(
        ref=pod_ref(pod),
        active=meta.get("deletionTimestamp") is None and phase not in FINISHED_PHASES,
        admitted=phase not in (None, "Pending")
        or bool(status.get("containerStatuses") or status.get("initContainerStatuses")),
        assigned=gpu_assigned(annotations),
        predicate_time=predicate_time_ns(annotations),
        request=request,
        gpu_index=annotations.get(contract.GPU_INDEX),
        scheduler=text(path(pod, "spec").get("schedulerName")) or "default-scheduler",
        bound=any(
            isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
        problem=problem,
        asked=asked,
        asked_problem=asked_problem,
        env_names={
            text(c.get("name")) or "": frozenset(
                text(e.get("name")) or "" for e in sequence(c.get("env")) if isinstance(e, dict)
            )
            for field_name in ("containers", "initContainers")
            for c in sequence(spec.get(field_name))
            if isinstance(c, dict)
        },
        container_ids={
            cid.partition("://")[2] or cid: text(c.get("name")) or ""
            for field_name in (
                "containerStatuses",
                "initContainerStatuses",
                "ephemeralContainerStatuses",
            )
            for c in sequence(status.get(field_name))
            if isinstance(c, dict) and (cid := text(c.get("containerID")) or "")
        },
        frameworks=pod_frameworks(annotations),
    )


def kubelet_order(request: PodRequest) -> tuple[ContainerRequest, ...]:
    """GPU containers in the order the kubelet allocates them: init containers, then app."""
    return tuple(c for c in request.containers if c.init) + tuple(
        c for c in request.containers if not c.init
    )

"""What the admission webhook does to a GPU pod at creation, and the one reader of what it
records: pure, no I/O.

Users write `volcano.sh/gpu-memory` in MiB, as Volcano's guide does. Nodes advertise one
device per memory unit (the cluster's unit, GPUShareConfig `spec.memoryUnitMiB`), because the
kubelet writes every allocated device id into the pod's status and compares every device with
every allocation after a restart. At creation each container's gpu-memory limit (and its
request, which the apiserver has defaulted to it) becomes whole units, rounded up, and two
annotations keep the unit and the MiB each container asked: the scheduler places the pod only
on nodes of that unit, the device plugin tells the container its MiB. Every GPU pod (whole
cards too) is labelled a GPU pod, the label the apiserver's placement policy selects.

A cluster whose pods already write units (Volcano's `--gpu-memory-factor`) sets
`spec.podMemoryLimits: Units`: limits are left as they are and the annotations still written.
Converting is idempotent: a pod whose annotations agree with its limits (the webhook called a
second time, or a pod re-created from `kubectl get -o yaml`) is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpushare.model import contract
from gpushare.model.bodies import (
    Body,
    annotations_of,
    describe,
    labels_of,
    mapping,
    path,
    sequence,
    text,
)
from gpushare.model.errors import InvalidAnnotation, InvalidRequest
from gpushare.model.limits import frameworks_named
from gpushare.model.quantity import parse_quantity
from gpushare.model.request import GpuKind, gpu_request

KUBE_SCHEDULER_NAME = "default-scheduler"
_ASKED = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?=[1-9][0-9]{0,9}")
_UNIT = re.compile(r"[1-9][0-9]{0,6}")


class LimitsIn(StrEnum):
    """What a pod's gpu-memory limit counts, as users write it."""

    MIB = "MiB"
    UNITS = "Units"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryAsked:
    """A converted pod's unit and the MiB each of its gpu-memory containers asked."""

    unit_mib: int
    mib: Mapping[str, int]

    def annotations(self) -> dict[str, str]:
        return {
            contract.MEMORY_UNIT_MIB: str(self.unit_mib),
            contract.GPU_MEMORY_MIB: ",".join(f"{name}={mib}" for name, mib in self.mib.items()),
        }


def memory_asked(annotations: Mapping[str, str], *, owner: str) -> MemoryAsked | None:
    """The unit and MiB the admission webhook recorded; None on a pod it never converted (one
    created before it was installed); InvalidAnnotation when they were edited out of shape."""
    unit = annotations.get(contract.MEMORY_UNIT_MIB)
    asked = annotations.get(contract.GPU_MEMORY_MIB)
    if unit is None and asked is None:
        return None
    fix = "delete the pod and create it again (the gpushare admission webhook writes both)"
    if unit is None or _UNIT.fullmatch(unit) is None:
        raise InvalidAnnotation(
            f"{owner}: annotation {contract.MEMORY_UNIT_MIB}={unit!r} is not a whole number "
            f"of MiB; {fix}"
        )
    items = (asked or "").split(",")
    if not all(_ASKED.fullmatch(item) for item in items):
        raise InvalidAnnotation(
            f"{owner}: annotation {contract.GPU_MEMORY_MIB}={asked!r} is not a comma list "
            f"of container=MiB; {fix}"
        )
    mib = {name: int(value) for name, _, value in (item.partition("=") for item in items)}
    if len(mib) != len(items):
        raise InvalidAnnotation(
            f"{owner}: annotation {contract.GPU_MEMORY_MIB}={asked!r} names a container "
            f"twice; {fix}"
        )
    return MemoryAsked(unit_mib=int(unit), mib=mib)


def units_for(mib: int, unit_mib: int) -> int:
    """Whole units holding `mib`: rounded up, never down."""
    return -(-mib // unit_mib)


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionSettings:
    unit_mib: int = contract.DEFAULT_MEMORY_UNIT_MIB
    limits_in: LimitsIn = LimitsIn.MIB
    scheduler_names: frozenset[str] = frozenset({contract.DEFAULT_SCHEDULER_NAME})
    set_scheduler_name: bool = False
    """Give GPU pods that name kube-scheduler (or none) the first served scheduler name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Admitted:
    """The changes to make to a pod at creation; empty when it is admitted as it is."""

    units: Mapping[str, int]
    """Container name -> its new gpu-memory limit (and request), in units."""
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    """`contract.GPU_POD_LABEL`, unless the pod carries it already."""
    scheduler_name: str | None = None
    """The scheduler name to set, when it changes."""
    dropped: tuple[str, ...] = ()
    """Annotations to remove: records only gpushare's Binding writes (`contract.GANG_MIN_MEMBER`),
    forged at creation (or copied with the yaml of a pod bound before)."""

    def apply(self, pod: dict[str, Any]) -> None:
        """Make the changes on `pod` (a mutable manifest) in place."""
        spec = _child(pod, "spec")
        if self.scheduler_name is not None:
            spec["schedulerName"] = self.scheduler_name
        for field in ("containers", "initContainers"):
            for container in spec.get(field) or []:
                units = self.units.get(str(container.get("name")))
                resources = _child(container, "resources") if units is not None else {}
                for side in ("limits", "requests"):
                    amounts = resources.get(side)
                    if isinstance(amounts, dict) and contract.GPU_MEMORY in amounts:
                        amounts[contract.GPU_MEMORY] = str(units)
        for field, added in (("annotations", self.annotations), ("labels", self.labels)):
            if added:
                metadata = _child(pod, "metadata")
                metadata[field] = {**(metadata.get(field) or {}), **added}
        if self.dropped:
            annotations = _child(_child(pod, "metadata"), "annotations")
            for key in self.dropped:
                annotations.pop(key, None)


def _child(parent: dict[str, Any], key: str) -> dict[str, Any]:
    child = parent.get(key)
    if not isinstance(child, dict):
        child = parent[key] = {}
    return child


NOTHING = Admitted(units={}, annotations={}, labels={})
_BINDING_RECORDS = (contract.GANG_MIN_MEMBER,)


def admit(pod: Body, settings: AdmissionSettings) -> Admitted:
    """What to change on `pod` at creation, or InvalidRequest / InvalidQuantity naming the
    fix for a GPU pod that could never run (bad quantities, requests without limits, both
    resources, a scheduler name nobody serves). A pod asking for no GPU is left alone."""
    request = gpu_request(pod)
    _refuse_unequal_or_zero(pod)
    if request.kind is None:
        return NOTHING
    who = describe(pod, "pod")
    _check_frameworks(pod, who)
    scheduler_name = _scheduler_name(pod, request.kind, settings, who)
    labels = _gpu_pod_label(pod)
    dropped = tuple(key for key in _BINDING_RECORDS if key in annotations_of(pod))
    if request.kind is GpuKind.NUMBER:
        return Admitted(
            units={}, annotations={}, labels=labels, scheduler_name=scheduler_name, dropped=dropped
        )
    limits = {c.name: c.amount for c in request.containers}
    try:
        recorded = memory_asked(annotations_of(pod), owner=who)
    except InvalidAnnotation:
        recorded = None  # rewritten below from the limits
    if recorded is not None and _agrees(recorded, limits):
        return Admitted(
            units={}, annotations={}, labels=labels, scheduler_name=scheduler_name, dropped=dropped
        )
    unit = settings.unit_mib
    if settings.limits_in is LimitsIn.UNITS:
        asked = MemoryAsked(unit_mib=unit, mib={n: a * unit for n, a in limits.items()})
        units: dict[str, int] = {}
    else:
        asked = MemoryAsked(unit_mib=unit, mib=limits)
        units = {name: units_for(mib, unit) for name, mib in limits.items()}
    return Admitted(
        units=units,
        annotations=asked.annotations(),
        labels=labels,
        scheduler_name=scheduler_name,
        dropped=dropped,
    )


def _check_frameworks(pod: Body, who: str) -> None:
    """InvalidAnnotation for a `gpushare.io/framework-limits` that names no framework: set at
    creation and never changed after, a typo would otherwise go unseen for the pod's life."""
    raw = annotations_of(pod).get(contract.FRAMEWORK_LIMITS)
    if raw is None:
        return
    try:
        frameworks_named(raw)
    except ValueError as error:
        raise InvalidAnnotation(
            f"{who}: its annotation {contract.FRAMEWORK_LIMITS}={raw!r}: {error}"
        ) from None


def _gpu_pod_label(pod: Body) -> dict[str, str]:
    """The label to set, unless the pod carries it already (re-created from its yaml)."""
    if labels_of(pod).get(contract.GPU_POD_LABEL) == contract.GPU_POD_LABEL_VALUE:
        return {}
    return dict(contract.GPU_POD_LABELS)


_GPU_RESOURCES = frozenset({contract.GPU_MEMORY, contract.GPU_NUMBER})
_MIRROR = "kubernetes.io/config.mirror"
"""The annotation of a static pod's mirror (the kubelet's copy in the API)."""


def asks_for_gpus(pod: Body) -> bool:
    """Whether a container of the pod (init containers too) names a GPU resource in its limits
    or requests, whatever the amount."""
    spec = path(pod, "spec")
    return any(
        name in _GPU_RESOURCES
        for field in ("containers", "initContainers")
        for container in sequence(spec.get(field))
        for side in ("limits", "requests")
        for name in path(container, "resources", side)
    )


def lacks_gpu_pod_label(pod: Body) -> bool:
    """A GPU pod without `contract.GPU_POD_LABEL`: one created before gpushare labelled GPU
    pods, or while it was not installed. The placement policy judges it only once labelled
    (the operator does that). A static pod's mirror is none: it gets no card, and the policies
    leave it alone."""
    return (
        contract.GPU_POD_LABEL not in labels_of(pod)
        and _MIRROR not in annotations_of(pod)
        and asks_for_gpus(pod)
    )


def _refuse_unequal_or_zero(pod: Body) -> None:
    """InvalidRequest for a GPU limit of 0 (it asks for nothing, and unconverted it would
    pass for a pod the webhook never saw) and for a request that differs from its limit
    (the apiserver refuses that for any extended resource; converting the limit would hide
    it by overwriting the request)."""
    who = describe(pod, "pod")
    spec = path(pod, "spec")
    for field, kind_of in (("containers", "container"), ("initContainers", "init container")):
        for container in sequence(spec.get(field)):
            name = text(mapping(container).get("name")) or "<unnamed>"
            owner = f"{who} {kind_of} {name}"
            resources = mapping(mapping(container).get("resources"))
            limits, requests = mapping(resources.get("limits")), mapping(resources.get("requests"))
            for kind in GpuKind:
                if kind.value not in limits:
                    continue
                limit = parse_quantity(limits[kind.value], resource=kind.value, owner=owner)
                if limit == 0:
                    raise InvalidRequest(
                        f"{owner} sets {kind.value}: 0, which asks for no GPU; remove the "
                        f"limit from a container that needs none"
                    )
                if kind.value in requests:
                    asked = parse_quantity(requests[kind.value], resource=kind.value, owner=owner)
                    if asked != limit:
                        raise InvalidRequest(
                            f"{owner} requests {kind.value} {requests[kind.value]} but its "
                            f"limit is {limits[kind.value]}; a GPU resource cannot be "
                            f"overcommitted, so its request must equal its limit: set only "
                            f"the limit (the request follows it)"
                        )


def _agrees(recorded: MemoryAsked, limits: Mapping[str, int]) -> bool:
    return recorded.mib.keys() == limits.keys() and all(
        limits[name] == units_for(mib, recorded.unit_mib) for name, mib in recorded.mib.items()
    )


def _scheduler_name(pod: Body, kind: GpuKind, settings: AdmissionSettings, who: str) -> str | None:
    spec = path(pod, "spec")
    name = text(spec.get("schedulerName")) or KUBE_SCHEDULER_NAME
    if name in settings.scheduler_names or text(spec.get("nodeName")):
        # A pod with its node preset meets no scheduler: the policy refuses it for that.
        return None
    served = sorted(settings.scheduler_names)
    if settings.set_scheduler_name and name == KUBE_SCHEDULER_NAME:
        return served[0]
    raise InvalidRequest(
        f"{who} asks for {kind.value} but its spec.schedulerName {name!r} is not served by "
        f"gpushare (it serves {', '.join(served)}): another scheduler would bind it and the "
        f"kubelet refuse it. Set spec.schedulerName: {served[0]}"
    )

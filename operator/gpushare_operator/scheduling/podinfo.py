"""A pod as the scheduler reads it, parsed once per event (as kube-scheduler's `PodInfo`).

The pod reflector's transform makes one for every event, so the runtime, the cache, the
queue and the decision read typed fields, never the raw object again. What an unbound pod
asks for (`demand`) and a bound pod's `fingerprint` are worked out on first use, once (most
events need neither: a pod's own status updates, pods of other schedulers); what a bound pod
holds (its resource requests and GPU claim) is parsed by the cache only when the fingerprint
says that something it reads has changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gpushare.kube.clock import parse_time
from gpushare.model import (
    GpuKind,
    GpuShareError,
    NodeName,
    PodRef,
    PodRequest,
    contract,
    gpu_request,
)
from gpushare.model.admission import asks_for_gpus, lacks_gpu_pod_label, memory_asked
from gpushare.model.annotations import gang_min_member, gpu_assigned
from gpushare.model.bodies import Body, annotations_of, labels_of, resource_version, text
from gpushare.model.filters import PodNeeds, pod_needs, unsupported
from gpushare.model.gangs import GroupApi, GroupKey, group_of, volcano_default_group
from gpushare.model.usage import FINISHED_PHASES, PodUid, pod_ref
from gpushare.model.volumes import PodVolumes, pod_volumes
from gpushare_operator.scheduling.slim import slim_pod


@dataclass(frozen=True, slots=True)
class Demand:
    """What an unbound pod asks for: its GPU request and what the node filters check."""

    request: PodRequest
    needs: PodNeeds
    unit_mib: int | None = None
    """The MiB per device a gpu-memory pod's limits were converted to at admission; None
    for a pod created before the webhook (read in the unit of whichever node it lands on)."""
    scheduler_name: str | None = None
    """The pod's spec.schedulerName: a node's device plugin serves only the names it is told."""
    volumes: PodVolumes | None = None
    """The PersistentVolumeClaims it uses, if any."""


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    body: Body
    """The slim copy (`slim_pod`): what is kept of the pod."""
    ref: PodRef
    node: NodeName | None
    """spec.nodeName: None while unbound."""
    scheduler_name: str | None
    finished: bool
    """Succeeded or Failed: it holds nothing any more."""
    terminating: bool
    gated: bool
    """It has scheduling gates: the apiserver refuses to bind it."""
    priority: int
    assigned: bool
    """The kubelet has started it (gpu-assigned is "true")."""
    resource_version: int | None
    """None where the version is not a number (then event order is trusted)."""
    unschedulable: bool = False
    """Its PodScheduled condition is False (a report only updates the message)."""
    group: GroupKey | None = None
    """The PodGroup it names (`gangs.group_of`), if any."""
    phase: str | None = None
    controlled: bool = False
    """A controller owns it (a Job, a Volcano Job, a ReplicaSet): deleted, it comes back."""
    preempts: bool = True
    """It may evict pods of lower priority to make room (`preemptionPolicy` is not Never)."""
    unlabelled: bool = False
    """A GPU pod without `contract.GPU_POD_LABEL` (made before gpushare labelled them): its
    Binding adds it, or the labeller does (`gpushare_operator.labeller`)."""
    guarded: bool = False
    """A GPU pod, bound and labelled one: its `gpushare.io/*` annotations are gpushare's record
    (nobody else may write them after creation: the placement policy; anyone may label a pod
    without a GPU, which no webhook or Binding writes for)."""
    bound_gang_min: int | None = None
    """`contract.GANG_MIN_MEMBER`, its gang's minMember when it was bound, on a `guarded`
    pod (the webhook drops it at creation, the Binding writes it); None otherwise, or for a
    value that is no whole number."""
    carries_gang_min: bool = False
    """It has `contract.GANG_MIN_MEMBER` at all: on a pending pod, a value its Binding must
    overwrite."""
    in_default_gang: bool = False
    """It names Volcano's default gang for it (`gangs.volcano_default_group`), which may be
    added after it was bound."""

    @property
    def uid(self) -> PodUid:
        return self.ref.uid

    @cached_property
    def created_s(self) -> float | None:
        return parse_time(self.body["metadata"].get("creationTimestamp"))

    @cached_property
    def started_s(self) -> float:
        """When it started (status.startTime), else was created: work lost counts from here."""
        status, meta = self.body["status"], self.body["metadata"]
        return parse_time(status.get("startTime") or meta.get("creationTimestamp")) or 0.0

    @property
    def labels(self) -> Mapping[str, str]:
        labels = self.body["metadata"].get("labels")
        return labels if isinstance(labels, dict) else {}

    @cached_property
    def fingerprint(self) -> int:
        """A hash of what the cache reads of a bound pod, but `gpu-assigned`, which only ever
        lifts the pod's assignment wait (the cache's fast path for the device plugin's write)."""
        meta, spec = self.body["metadata"], self.body["spec"]
        annotations = annotations_of(self.body)
        return hash(
            repr(
                (
                    self.node,
                    spec.get("containers"),
                    spec.get("initContainers"),
                    spec.get("overhead"),
                    self.body["status"]["phase"],
                    meta.get("deletionTimestamp"),
                    annotations.get(contract.GPU_INDEX),
                    annotations.get(contract.PREDICATE_TIME),
                )
            )
        )

    @cached_property
    def demand(self) -> Demand | str | None:
        """An unbound pod's demand, or why it cannot be read or met; None for a bound pod."""
        if self.node is not None:
            return None
        try:
            request = gpu_request(self.body)
            asked = None
            if request.kind is GpuKind.MEMORY:
                asked = memory_asked(annotations_of(self.body), owner=f"pod {self.ref}")
            unit_mib = None if asked is None else asked.unit_mib
            demand = Demand(
                request,
                pod_needs(self.body),
                unit_mib,
                self.scheduler_name,
                pod_volumes(self.body),
            )
        except GpuShareError as error:
            return str(error)
        return unsupported(self.body) or demand

    @classmethod
    def parse(cls, raw: Body) -> PodInfo:
        body = slim_pod(raw)
        meta, spec = body["metadata"], body["spec"]
        annotations = annotations_of(body)
        node = text(spec.get("nodeName"))
        phase = body["status"]["phase"]
        priority = spec.get("priority")
        group = group_of(raw)
        raw_annotations = annotations_of(raw)  # the slim copy keeps only those it reads
        guarded = (
            bool(node)
            and labels_of(raw).get(contract.GPU_POD_LABEL) == contract.GPU_POD_LABEL_VALUE
            and asks_for_gpus(raw)
        )
        return cls(
            body=body,
            ref=pod_ref(body),
            node=NodeName(node) if node else None,
            scheduler_name=text(spec.get("schedulerName")),
            finished=phase in FINISHED_PHASES,
            terminating=meta.get("deletionTimestamp") is not None,
            gated=bool(spec.get("schedulingGates")),
            priority=priority if isinstance(priority, int) else 0,
            assigned=gpu_assigned(annotations),
            resource_version=resource_version(body),
            unschedulable=any(
                c.get("status") == "False" for c in body["status"].get("conditions", ())
            ),
            group=group,
            phase=text(phase),
            controlled=any(
                isinstance(owner, dict) and owner.get("controller") is True
                for owner in raw.get("metadata", {}).get("ownerReferences") or ()
            ),
            preempts=spec.get("preemptionPolicy") != "Never",
            unlabelled=lacks_gpu_pod_label(raw),  # the slim copy has no mirror annotation
            guarded=guarded,
            bound_gang_min=gang_min_member(raw_annotations) if guarded else None,
            carries_gang_min=contract.GANG_MIN_MEMBER in raw_annotations,
            in_default_gang=group is not None
            and group.api is GroupApi.VOLCANO
            and group.name == volcano_default_group(raw),
        )

    @classmethod
    def gone(cls, uid: PodUid) -> PodInfo:
        """A pod known only by its uid: one that a LIST no longer shows."""
        return cls.parse({"metadata": {"uid": uid}})

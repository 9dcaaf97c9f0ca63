"""Gangs: pods of a group placed all together or not at all.

Groups are read from where users put them: Volcano's PodGroup (`scheduling.volcano.sh`,
pods annotated `scheduling.k8s.io/group-name`) and the scheduler-plugins' coscheduling
PodGroup (`scheduling.x-k8s.io`, pods labelled `scheduling.x-k8s.io/pod-group`). This module
reads a pod's group, a PodGroup's spec, says why a gang waits, and writes the PodGroup's
status as the scheduler that owns that API writes it. Placing a gang is the scheduler's
(`gpushare_operator.scheduling.gangs`): each member under the same filters and policy as a
single pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from gpushare.model.bodies import Body, annotations_of, mapping, path, sequence, text
from gpushare.model.errors import GpuShareError
from gpushare.model.resources import resource_list

VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
"""Volcano reads both (the first is what its job controller writes)."""
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


class InvalidGroup(GpuShareError):
    """A PodGroup whose spec cannot be honoured as written."""


class GroupApi(Enum):
    """The two PodGroup APIs: (group, version); both name the kind PodGroup, plural podgroups."""

    VOLCANO = ("scheduling.volcano.sh", "v1beta1")
    COSCHEDULING = ("scheduling.x-k8s.io", "v1alpha1")

    @property
    def group(self) -> str:
        return self.value[0]

    @property
    def version(self) -> str:
        return self.value[1]


PLURAL = "podgroups"


@dataclass(frozen=True, slots=True)
class GroupKey:
    api: GroupApi
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"PodGroup {self.namespace}/{self.name}"


def group_of(pod: Body) -> GroupKey | None:
    """The group a pod names, if any (the one reader of the annotation and the label)."""
    meta = path(pod, "metadata")
    namespace = text(meta.get("namespace")) or "default"
    annotations = annotations_of(pod)
    for key in VOLCANO_GROUP_ANNOTATIONS:
        if annotations.get(key):
            return GroupKey(GroupApi.VOLCANO, namespace, annotations[key])
    label = text(mapping(meta.get("labels")).get(COSCHEDULING_GROUP_LABEL))
    if label:
        return GroupKey(GroupApi.COSCHEDULING, namespace, label)
    return None


def volcano_default_group(pod: Body) -> str:
    """The gang Volcano's PodGroup controller puts a pod of its scheduler name in when it names
    none, after its creation: `podgroup-<the UID of its controller, else its own>`
    (GeneratePodgroupName), with minMember 1."""
    meta = path(pod, "metadata")
    owners = [
        owner for owner in sequence(meta.get("ownerReferences")) if owner.get("controller") is True
    ]
    return f"podgroup-{text(owners[0].get('uid')) if owners else text(meta.get('uid'))}"


def held_min_member(min_member: int, bound_under: Iterable[int]) -> int:
    """The minMember preemption holds a gang to: the largest m such that m of its bound
    members were bound under a minMember of m or more (`bound_under`, one for each member that
    says), and never more than its PodGroup's now (`min_member`, also where none says).

    A gang placed whole under minMember m has m members bound under m. A tenant who raises the
    PodGroup's minMember after its pods are bound, and then has one more member bound under
    the new value, has one member that says so, not m: its gang stays held to what its
    members were placed under, and no dearer to preempt. (So is a gang whose minMember its
    controller raised as it grew: held to what the members bound before were placed under.)"""
    ordered = sorted(bound_under, reverse=True)
    if not ordered:
        return min_member
    attested = sum(1 for rank, under in enumerate(ordered, start=1) if under >= rank)
    return min(min_member, attested)


def group_key(api: GroupApi, body: Body) -> GroupKey:
    meta = path(body, "metadata")
    return GroupKey(api, text(meta.get("namespace")) or "default", text(meta.get("name")) or "")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    key: GroupKey
    min_member: int
    min_resources: Mapping[str, int]
    """In scheduler units (`resources.resource_list`); gpu-memory in MiB, as pods write it."""
    priority_class: str | None
    timeout_s: float | None
    """`scheduleTimeoutSeconds` (coscheduling only; None: the operator's default)."""
    created: str | None
    """metadata.creationTimestamp, RFC 3339."""
    status: Body
    """As last seen: what a write compares with (`group_status`)."""

    @property
    def is_gang(self) -> bool:
        return self.min_member > 1


def group_spec(api: GroupApi, body: Body) -> GroupSpec:
    """A PodGroup's spec. Raises InvalidGroup naming the PodGroup and the fix."""
    key = group_key(api, body)
    spec = path(body, "spec")
    raw_min = spec.get("minMember", 1)
    if isinstance(raw_min, bool) or not isinstance(raw_min, int) or raw_min < 1:
        raise InvalidGroup(
            f"{key}: minMember {raw_min!r} is not a whole number of 1 or more; set "
            f"spec.minMember to how many of its pods must run together (1: no gang)"
        )
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1
    ):
        raise InvalidGroup(
            f"{key}: scheduleTimeoutSeconds {timeout!r} is not a whole number of 1 or more"
        )
    try:
        min_resources = resource_list(spec.get("minResources"), owner=f"{key} minResources")
    except GpuShareError as error:
        raise InvalidGroup(str(error)) from error
    return GroupSpec(
        key=key,
        min_member=raw_min,
        min_resources=min_resources,
        priority_class=text(spec.get("priorityClassName")),
        timeout_s=None if timeout is None else float(timeout),
        created=text(path(body, "metadata").get("creationTimestamp")),
        status=path(body, "status"),
    )


@dataclass(frozen=True, slots=True)
class Members:
    """A group's pods as the scheduler sees them now."""

    pending: int
    """Unbound, ours, not gated."""
    bound: int
    """Bound (or being bound) and not finished."""
    running: int
    succeeded: int
    failed: int


def missing_members(spec: GroupSpec, members: Members) -> str | None:
    """Why the gang cannot be tried yet: fewer than `minMember` of its pods exist."""
    have = members.pending + members.bound
    if have >= spec.min_member:
        return None
    return (
        f"gang {spec.key}: {have} of minMember {spec.min_member} pods exist "
        f"({members.bound} bound, {members.pending} pending); none is bound until "
        f"{spec.min_member} can be placed together"
    )


def timed_out_message(spec: GroupSpec, waiting: str, timeout_s: float) -> str:
    return (
        f"{waiting}; timed out: the gang has waited over {timeout_s:g} s "
        f"(scheduleTimeoutSeconds, or the operator's --gang-timeout-seconds); its pods stay "
        f"pending until the group can run: delete them, or lower minMember"
    )


class GroupPhase(StrEnum):
    PENDING = "Pending"
    INQUEUE = "Inqueue"  # Volcano: its minimum resources could be placed
    SCHEDULED = "Scheduled"  # coscheduling: minMember bound
    RUNNING = "Running"
    COMPLETED = "Completed"  # Volcano
    FINISHED = "Finished"  # coscheduling


UNSCHEDULABLE = "Unschedulable"
SCHEDULED = "Scheduled"


@dataclass(frozen=True, slots=True)
class GroupState:
    """What the scheduler knows of a group, for its status."""

    members: Members
    enqueued: bool
    """Its minResources fit the cluster's free resources (Volcano's enqueue check)."""
    reason: str | None
    """Why it waits, or None."""
    reason_code: str = "NotEnoughResources"


def group_status(spec: GroupSpec, state: GroupState, now: str) -> dict[str, Any]:
    """The PodGroup's status as the owner of its API writes it: Volcano's phases (Pending,
    Inqueue, Running, Completed) and conditions (Unschedulable, Scheduled, each with its
    lastTransitionTime kept while its status holds); the coscheduling phases (Pending,
    Scheduled, Running, Finished) and `scheduleStartTime`. Counts as both write them."""
    members = state.members
    previous = spec.status
    last = text(previous.get("phase"))
    volcano = spec.key.api is GroupApi.VOLCANO
    if members.running >= spec.min_member:
        phase = GroupPhase.RUNNING
    elif members.succeeded >= spec.min_member and members.running == 0 and members.pending == 0:
        phase = GroupPhase.COMPLETED if volcano else GroupPhase.FINISHED
    elif volcano:
        started = last in (GroupPhase.INQUEUE, GroupPhase.RUNNING)
        phase = GroupPhase.INQUEUE if state.enqueued or started else GroupPhase.PENDING
    elif members.bound >= spec.min_member:
        phase = GroupPhase.SCHEDULED
    else:
        phase = GroupPhase.PENDING
    status: dict[str, Any] = {
        "phase": phase.value,
        "running": members.running,
        "succeeded": members.succeeded,
        "failed": members.failed,
    }
    if not volcano:
        status["scheduleStartTime"] = text(previous.get("scheduleStartTime")) or now
        return status
    kept = {
        text(c.get("type")): mapping(c)
        for c in previous.get("conditions") or ()
        if isinstance(c, Mapping)
    }
    if state.reason is not None:
        condition = _condition(kept.get(UNSCHEDULABLE), UNSCHEDULABLE, state, now)
    else:
        condition = _condition(kept.get(SCHEDULED), SCHEDULED, state, now)
    status["conditions"] = [condition]
    return status


def _condition(
    previous: Mapping[str, Any] | None, kind: str, state: GroupState, now: str
) -> dict[str, Any]:
    unschedulable = kind == UNSCHEDULABLE
    since = previous.get("lastTransitionTime") if previous is not None else None
    if previous is None or previous.get("status") != "True":
        since = now
    return {
        "type": kind,
        "status": "True",
        "reason": state.reason_code if unschedulable else "tasks in gang are ready to be scheduled",
        "message": state.reason or "",
        "lastTransitionTime": since,
        "transitionID": "",
    }

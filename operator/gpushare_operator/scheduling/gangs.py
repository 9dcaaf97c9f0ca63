"""Gangs in the scheduler: the PodGroups and their members, and the all-or-nothing decision.

A gang is tried when any of its members is popped from the queue, so groups go in the
queue's order (priority, then age). The decision is one synchronous step, like a single
pod's: each pending member is planned and assumed in turn (highest priority, then oldest
first) under the same filters, policy and exactness rule as a single pod, but never waiting
for a card the rule holds back a moment (a member of the same size bound just before on the
same node, not yet assigned by the device plugin): such a member counts as placed, its card
reserved, and is bound once the one before is assigned. If fewer than `minMember` members
(counting those already bound) get a place, every assumption is undone before the next await,
so a waiting gang never holds a card from a pod that fits now.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.kube.clock import parse_time
from gpushare.model import GpuShareError, Placement, PodUid
from gpushare.model.bodies import Body
from gpushare.model.gangs import (
    GroupApi,
    GroupKey,
    GroupSpec,
    GroupState,
    Members,
    group_key,
    group_spec,
    missing_members,
    timed_out_message,
)
from gpushare.model.placement import Policy
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import Plan, Refusal, plan
from gpushare_operator.scheduling.podinfo import PodInfo


class GangBook:
    """The PodGroups as last seen, their members' latest states, and each gang's verdict
    (for the PodGroup's status)."""

    def __init__(self) -> None:
        self._specs: dict[GroupKey, GroupSpec | str] = {}
        self._members: dict[GroupKey, dict[PodUid, PodInfo]] = {}
        self._highest: dict[GroupKey, int] = {}
        """The highest priority a member of each gang was admitted with."""
        self._group_of: dict[PodUid, GroupKey] = {}
        self._verdicts: dict[GroupKey, GroupVerdict] = {}
        self._priority_classes: dict[str, int] = {}

    def observe_group(self, api: GroupApi, body: Body) -> GroupKey:
        key = group_key(api, body)
        try:
            self._specs[key] = group_spec(api, body)
        except GpuShareError as error:
            self._specs[key] = str(error)
        return key

    def forget_group(self, key: GroupKey) -> None:
        self._specs.pop(key, None)
        self._verdicts.pop(key, None)

    def specs(self) -> list[GroupSpec]:
        """The PodGroups that can be honoured."""
        return [spec for spec in self._specs.values() if isinstance(spec, GroupSpec)]

    def written(self, key: GroupKey, status: Mapping[str, Any]) -> None:
        """The status just written: compared with until the watch shows it."""
        spec = self._specs.get(key)
        if isinstance(spec, GroupSpec):
            self._specs[key] = dataclasses.replace(spec, status={**spec.status, **status})

    def keys(self, api: GroupApi) -> set[GroupKey]:
        return {key for key in self._specs if key.api is api}

    def spec(self, key: GroupKey) -> GroupSpec | str | None:
        """The group's spec; a message when it cannot be honoured; None with no PodGroup."""
        return self._specs.get(key)

    def observe_member(self, pod: PodInfo) -> None:
        before = self._group_of.get(pod.uid)
        if before is not None and before != pod.group:
            self.forget_member(pod.uid)
        if pod.group is None:
            return
        self._group_of[pod.uid] = pod.group
        self._members.setdefault(pod.group, {})[pod.uid] = pod
        # A pod's priority never changes (spec.priority is immutable).
        self._highest[pod.group] = max(self._highest.get(pod.group, pod.priority), pod.priority)

    def forget_member(self, uid: PodUid) -> GroupKey | None:
        key = self._group_of.pop(uid, None)
        if key is not None:
            members = self._members.get(key, {})
            members.pop(uid, None)
            if not members:
                self._members.pop(key, None)
                self._highest.pop(key, None)
            else:
                self._highest[key] = max(member.priority for member in members.values())
        return key

    def observe_priority_class(self, name: str, value: object) -> None:
        if isinstance(value, int) and not isinstance(value, bool):
            self._priority_classes[name] = value

    def forget_priority_class(self, name: str) -> None:
        self._priority_classes.pop(name, None)

    def priority_class_names(self) -> set[str]:
        return set(self._priority_classes)

    def priority_of(self, pod: PodInfo) -> int:
        """The pod's priority in the queue and in preemption: its own, or its gang's when that
        is higher, so that a gang goes as one.

        A gang's priority is its PodGroup's `priorityClassName`, but never above the highest
        priority one of its members was admitted with. A PodGroup passes through no priority
        admission, as pods do (the Priority plugin, ResourceQuotas scoped to a class): a tenant
        who may create PodGroups could otherwise name any class on one and lift plain pods to
        it, to go first and preempt others' pods. A Volcano Job gives its pods its class too."""
        spec = self._specs.get(pod.group) if pod.group is not None else None
        if not isinstance(spec, GroupSpec) or spec.priority_class is None:
            return pod.priority
        value = self._priority_classes.get(spec.priority_class, pod.priority)
        admitted = self._highest.get(spec.key, pod.priority)
        return max(pod.priority, min(value, admitted))

    def members(self, key: GroupKey) -> list[PodInfo]:
        return list(self._members.get(key, {}).values())

    def pending(self, key: GroupKey, cache: SchedulerCache) -> list[PodInfo]:
        """The members the scheduler may bind now, in the order a gang places them:
        highest priority, then oldest."""
        return sorted(
            (pod for pod in self._members.get(key, {}).values() if _pending(pod, cache)),
            key=lambda pod: (-self.priority_of(pod), pod.created_s or 0.0, pod.ref.name),
        )

    def counts(self, key: GroupKey, cache: SchedulerCache) -> Members:
        pending = bound = running = succeeded = failed = 0
        for pod in self._members.get(key, {}).values():
            if pod.phase == "Succeeded":
                succeeded += 1
            elif pod.phase == "Failed":
                failed += 1
            elif cache.holds(pod.uid):
                bound += 1
                running += pod.phase == "Running"
            elif _pending(pod, cache):
                pending += 1
        return Members(pending, bound, running, succeeded, failed)

    def judge(self, key: GroupKey, verdict: GroupVerdict) -> None:
        self._verdicts[key] = verdict

    def verdict(self, key: GroupKey) -> GroupVerdict | None:
        return self._verdicts.get(key)

    def state(self, spec: GroupSpec, cache: SchedulerCache) -> GroupState:
        """For the PodGroup's status: the members now, whether its minResources fit the
        cluster's free resources (Volcano's enqueue check), and the last verdict on the gang."""
        members = self.counts(spec.key, cache)
        enqueued = cache.could_hold(spec.min_resources)
        verdict = self._verdicts.get(spec.key)
        if verdict is not None and verdict.reason is not None:
            return GroupState(members, enqueued, verdict.reason, verdict.code)
        if not enqueued and members.bound < spec.min_member:
            return GroupState(members, enqueued, f"{spec.key}: its minResources do not fit now")
        return GroupState(members, enqueued, None)


def broken_gang(cache: SchedulerCache, book: GangBook, key: GroupKey) -> list[PodInfo]:
    """The bound members to evict when a gang that has not started fell below its minimum
    (a member deleted, or its bind refused, after the others were bound): so that the cards
    are not held for a gang that cannot run, and it waits again whole. Only members a
    controller owns (it creates them again); a bare pod is kept, as deleting it would lose it.
    None once any member runs or has run: members ending is then the job's own business."""
    spec = book.spec(key)
    if not isinstance(spec, GroupSpec) or not spec.is_gang:
        return []
    members = book.counts(key, cache)
    started = members.running or members.succeeded
    if started or not members.bound or members.bound + members.pending >= spec.min_member:
        return []
    bound = [pod for pod in book.members(key) if cache.holds(pod.uid) and not pod.terminating]
    kept = [pod for pod in bound if not pod.controlled]
    evicted = [pod for pod in bound if pod.controlled]
    reason = (
        f"gang {key}: {members.bound} bound and {members.pending} pending of minMember "
        f"{spec.min_member}, below its minimum before it ran"
    )
    if evicted:
        reason += f"; evicted {len(evicted)} bound pod(s), which their controller creates again"
    if kept:
        reason += (
            f"; kept {len(kept)} bound pod(s) that no controller owns (deleting them would lose "
            f"them): delete them, or add members"
        )
    book.judge(key, GroupVerdict(reason, "NotEnoughMembers"))
    return evicted


def _pending(pod: PodInfo, cache: SchedulerCache) -> bool:
    """Unbound, ours, not gated: a member the scheduler may bind now."""
    return cache.pending(pod.uid) is not None and not pod.gated


NOT_ENOUGH_RESOURCES = "NotEnoughResources"
"""The verdict on a gang whose members are all there but do not fit together (preemption
may make room); the others are NotEnoughMembers and Timeout."""


@dataclass(frozen=True, slots=True)
class GroupVerdict:
    reason: str | None
    """Why the gang waits; None once placed."""
    code: str = NOT_ENOUGH_RESOURCES


@dataclass(slots=True)
class GangDecision:
    placed: list[tuple[PodInfo, Plan]] = field(default_factory=list)
    """Assumed in the cache, to bind."""
    refused: list[tuple[PodInfo, Refusal]] = field(default_factory=list)
    """To park and report (each member of a gang that waits; members beyond the minimum
    that do not fit)."""


def decide_gang(
    cache: SchedulerCache,
    book: GangBook,
    spec: GroupSpec,
    policy: Policy,
    *,
    timeout_s: float,
    waited: Mapping[PodUid, Placement],
    now: Callable[[], float] = time.time,
) -> GangDecision:
    """Place `spec`'s pending members all together, or none of them, and say why.
    `waited`: the placements members were reserved while they waited (already dropped)."""
    members = book.counts(spec.key, cache)
    pending = book.pending(spec.key, cache)
    decision = GangDecision()
    missing = missing_members(spec, members)
    if missing is not None:
        code = "NotEnoughMembers"
        created = parse_time(spec.created)
        limit = spec.timeout_s or timeout_s
        if created is not None and now() - created > limit:
            missing, code = timed_out_message(spec, missing, limit), "Timeout"
        book.judge(spec.key, GroupVerdict(missing, code))
        for pod in pending:
            cache.unreserve(pod.uid)
        decision.refused = [(pod, Refusal(missing, wake_key=spec.key)) for pod in pending]
        return decision
    failures: list[tuple[PodInfo, Refusal]] = []
    waiting: list[tuple[PodInfo, Refusal]] = []
    for pod in pending:
        outcome = plan(cache, pod, policy, cache.unreserve(pod.uid) or waited.get(pod.uid))
        if isinstance(outcome, Plan):
            cache.assume(pod, outcome)
            decision.placed.append((pod, outcome))
        elif outcome.waits_for is not None:
            # Its card is held back for a moment by the exactness rule (a member of the same
            # size bound just before on the node): counted placed, and bound once assigned.
            cache.reserve(pod, outcome.waits_for)
            waiting.append((pod, outcome))
        else:
            failures.append((pod, outcome))
    for pod, _ in waiting:
        cache.unreserve(pod.uid)  # the scheduler reserves it again as it parks the pod
    if members.bound + len(decision.placed) + len(waiting) >= spec.min_member:
        book.judge(spec.key, GroupVerdict(None))
        decision.refused = waiting + failures  # beyond the minimum: each waits on its own
        return decision
    for pod, _ in reversed(decision.placed):
        cache.forget_assumed(pod.uid)
    fit = members.bound + len(decision.placed) + len(waiting)
    first, refusal = failures[0]
    message = (
        f"gang {spec.key}: only {fit} of minMember {spec.min_member} pods can be placed "
        f"together now ({members.bound} bound); pod {first.ref} does not fit: "
        f"{refusal.message}"
    )
    book.judge(spec.key, GroupVerdict(message))
    decision.placed = []
    decision.refused = [(pod, Refusal(message, wake_key=spec.key)) for pod in pending]
    return decision

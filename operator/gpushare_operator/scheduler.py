"""The decision loop: one pod at a time against consistent state; binds in flight together.

A scheduling cycle (`schedule_one`) is synchronous: pop a pod, read its request, filter and
place it with the model, and assume the result in the cache; only then does the binding
cycle (`_bind`) run as its own task, so the next decision sees this one at once while API
calls overlap. A failed bind forgets the assumption and backs the pod off; a 409 or 404
(someone else bound it, or it is gone) drops it: what the scheduler then knows of the pod
is put on the intake's `findings` queue, which the intake takes as it takes the watch's
events (the scheduler never calls back into it). The other work the queue hands the loop, a
gang that lost a member (`GangCheck`), is checked here: its bound members evicted if it fell
below its minimum before it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from structlog.typing import FilteringBoundLogger

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.reflector import DELETED, MODIFIED
from gpushare.kube.retry import (
    BIND_ATTEMPTS,
    WRITE,
    bind_policy,
    retry,
    transient,
    wait_s,
)
from gpushare.model import Placement, PodRef, PodUid, contract
from gpushare.model.bodies import Body, annotations_of, path
from gpushare.model.gangs import GroupKey, GroupSpec
from gpushare.model.volume_binding import ClaimBinding
from gpushare.model.volumes import claim_facts, volume_facts
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import VolumeChanges
from gpushare_operator.kubeapi import NO_LABELS, Fenced, SchedulerApi
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import Plan, Refusal, plan
from gpushare_operator.scheduling.defrag import claim_freed
from gpushare_operator.scheduling.gangs import (
    NOT_ENOUGH_RESOURCES,
    GangBook,
    broken_gang,
    decide_gang,
)
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.preemption import (
    Room,
    make_room,
    make_room_for_gang,
    nominate,
    preemptor_message,
    victim_message,
)
from gpushare_operator.scheduling.queue import CardFreeing, GangCheck, SchedulingQueue

VOLUME_BIND_TIMEOUT_S = 600.0
"""How long a bind waits until its claims are bound (kube-scheduler's VolumeBinding
`bindTimeoutSeconds` default); the pod's card is held meanwhile."""
CLAIM_LOOK_S = 5.0
"""How often a bind that waits for its claims looks whether its pod is still there (a
change of a claim or volume wakes it at once)."""
PREEMPTING = "Preempting"
PREEMPTED = "Preempted"  # kube-scheduler's reason on a victim
GANG_MIN_MEMBER_MAX = 999_999_999
"""The most `contract.GANG_MIN_MEMBER` says (`annotations.gang_min_member` reads 9 digits)."""
PREEMPTED_CONDITION = "gpushare: preempting to accommodate a higher priority pod"
"""The DisruptionTarget condition's message on a victim deleted past its budget (kube-scheduler
writes its scheduler name where this says gpushare)."""


@dataclass(frozen=True, slots=True)
class _Decision:
    pod: PodInfo
    plan: Plan


def _landed(body: Body, node: str, annotations: Mapping[str, str]) -> bool:
    """Whether the pod read back shows this decision's Binding landed: bound to `node` with
    the predicate-time only this decision wrote (a pod without a card: the node alone)."""
    written = annotations.get(contract.PREDICATE_TIME)
    return path(body, "spec").get("nodeName") == node and (
        written is None or annotations_of(body).get(contract.PREDICATE_TIME) == written
    )


class _Slot:
    """A bind's place among the binds in flight (`max_concurrent_binds`), acquired before its
    task starts; lent back while it waits on others (until its claims are bound), so that pods
    waiting for volumes never hold up the binds of the rest."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()

    @contextlib.asynccontextmanager
    async def lent(self) -> AsyncIterator[None]:
        """Given back for the block; taken again after it, unless it ended in an error (a
        cancellation: the bind is over)."""
        self.release()
        yield
        await self._slots.acquire()  # cancelled while waiting: nothing is held
        self._held = True


class Scheduler:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        queue: SchedulingQueue,
        gangs: GangBook,
        api: SchedulerApi,
        reporter: Reporter,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
        findings: asyncio.Queue[tuple[str, PodInfo]],
        fence: WriteFence,
        volume_changes: VolumeChanges,
    ) -> None:
        """`fence`: asked before each Binding, eviction, claim and volume write.
        `volume_changes`: what binds that wait for their claims wait on."""
        self.cache = cache
        self.queue = queue
        self.gangs = gangs
        self._api = api
        self._reporter = reporter
        self._metrics = metrics
        self._config = config
        self._findings = findings
        self._fence = fence
        self._volume_changes = volume_changes
        self._in_flight: set[asyncio.Task[None]] = set()  # binds and evictions
        self._slots = asyncio.Semaphore(config().max_concurrent_binds)
        self._log = logs.get("scheduler")

    async def run(self) -> None:
        """Schedule until cancelled; in-flight binds are cancelled with it."""
        try:
            while True:
                work = await self.queue.pop()
                if isinstance(work, GangCheck):
                    self._check_gang(work.group)
                    continue
                if isinstance(work, CardFreeing):
                    self._claim_freed(work)
                    continue
                uid = work
                started = time.perf_counter()
                decisions = self.schedule_one(uid)
                self._metrics.attempt_duration.labels(
                    "scheduled" if decisions else "unschedulable"
                ).observe(time.perf_counter() - started)
                for index, decision in enumerate(decisions):
                    try:
                        await self._slots.acquire()  # bounds the binds in flight
                    except asyncio.CancelledError:
                        for undone in decisions[index:]:
                            self._not_bound(undone)
                        raise
                    task = asyncio.create_task(
                        self._bind(decision), name=f"bind {decision.pod.ref}"
                    )
                    self._in_flight.add(task)
                    task.add_done_callback(self._in_flight.discard)
                depth = self.queue.depth()
                self._metrics.pending_pods.labels("active").set(depth.active)
                self._metrics.pending_pods.labels("backoff").set(depth.backoff)
                self._metrics.pending_pods.labels("unschedulable").set(depth.parked)
        finally:
            for task in self._in_flight:
                task.cancel()
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    # -- scheduling cycle (synchronous) --------------------------------------------------

    def schedule_one(self, uid: PodUid) -> list[_Decision]:
        """Decide for one pod (or the gang it belongs to): assume and return the decisions,
        or report why not."""
        waited_for = self.cache.unreserve(uid)
        pod = self.cache.pending(uid)
        if pod is None:
            self.queue.remove(uid)
            return []
        if pod.gated:
            self.queue.park(uid)  # the apiserver refuses to bind gated pods
            return []
        if pod.group is not None:
            group = self.gangs.spec(pod.group)
            if isinstance(group, str):
                self._unschedulable(uid, pod, Refusal(group, wake_key=pod.group))
                return []
            if group is not None and group.is_gang:
                return self._schedule_gang(group, {uid: waited_for} if waited_for else {})
        outcome = plan(self.cache, pod, self._config().policy, waited_for)
        if isinstance(outcome, Refusal):
            self._unschedulable(uid, pod, self._make_room(pod, outcome))
            return []
        for earlier in outcome.expired.values():
            self._log.warning(
                "assignment_wait_expired",
                pod=str(pod.ref),
                waited_for=str(earlier),
                note="placed although an earlier pod of the same request is still unassigned",
            )
        self.cache.assume(pod, outcome)
        return [_Decision(pod, outcome)]

    def _schedule_gang(
        self, group: GroupSpec, waited: Mapping[PodUid, Placement]
    ) -> list[_Decision]:
        config = self._config()
        gang = decide_gang(
            self.cache,
            self.gangs,
            group,
            config.policy,
            timeout_s=config.gang_timeout_s,
            waited=waited,
        )
        refused: list[tuple[PodInfo, Refusal]] = list(gang.refused)
        verdict = self.gangs.verdict(group.key)
        short = verdict is not None and verdict.code == NOT_ENOUGH_RESOURCES
        if not gang.placed and refused and short and config.preemption:
            refused = self._make_room_for_gang(group, refused)
        for member, refusal in refused:
            self._unschedulable(member.uid, member, refusal)
        if gang.placed:
            self._log.info(
                "gang_placed", group=str(group.key), pods=[str(m.ref) for m, _ in gang.placed]
            )
        return [_Decision(member, outcome) for member, outcome in gang.placed]

    def _make_room_for_gang(
        self, group: GroupSpec, refused: list[tuple[PodInfo, Refusal]]
    ) -> list[tuple[PodInfo, Refusal]]:
        """A gang preempts as a whole: every member it needs gets its room, or none does."""
        priority = max(self.gangs.priority_of(pod) for pod, _ in refused)
        outcomes = make_room_for_gang(
            self.cache,
            self.gangs,
            group,
            refused,
            priority=priority,
            policy=self._config().policy,
        )
        return [
            (pod, self._preempt(pod, outcome, priority) if isinstance(outcome, Room) else outcome)
            for pod, outcome in outcomes
        ]

    def _make_room(self, pod: PodInfo, refusal: Refusal) -> Refusal:
        """Preempt for a pod that `refusal` keeps off every card, when that is allowed and
        some pods of lower priority can make room; what to report on it meanwhile."""
        if refusal.quiet:
            return refusal
        priority = self.gangs.priority_of(pod)
        outcome = make_room(
            self.cache,
            self.gangs,
            pod,
            refusal,
            priority=priority,
            may_preempt=self._config().preemption,
        )
        if isinstance(outcome, Refusal):
            if not outcome.quiet:
                self._metrics.preemption_attempts.labels("none").inc()
            return outcome
        return self._preempt(pod, outcome, priority)

    def _preempt(self, pod: PodInfo, outcome: Room, priority: int) -> Refusal:
        """Nominate the pod where `outcome` makes room, and evict its victims."""
        nominate(self.cache, pod, outcome)
        self._metrics.preemption_attempts.labels("nominated").inc()
        self._log.info(
            "preempting",
            pod=str(pod.ref),
            node=outcome.preemption.placement.node,
            card=list(outcome.preemption.placement.cards),
            victims=[str(ref) for ref in outcome.preemption.victims],
        )
        if outcome.preemption.victims:
            self._reporter.event(pod.ref, PREEMPTING, preemptor_message(pod.ref, outcome))
        past_budgets = set(outcome.preemption.past_budgets)
        for victim in outcome.preemption.victims:
            message = victim_message(pod.ref, priority, outcome, victim)
            self._start(
                self._evict_victim(pod.ref, victim, message, delete=victim in past_budgets),
                f"preempt {victim}",
            )
        return outcome.refusal

    async def _evict_victim(
        self, preemptor: PodRef, victim: PodRef, message: str, *, delete: bool
    ) -> None:
        """Evict one victim through the Eviction API, or, one whose PodDisruptionBudget the
        preemption breaks (`delete`), delete it with its own grace period, as kube-scheduler
        deletes its victims. A refusal (a budget that changed meanwhile, say) ends the
        nomination: the preemptor chooses again."""

        async def once() -> None:
            # Asked before every attempt: a retry may come after this replica stopped leading.
            self._fence.check(f"{'delete' if delete else 'evict'} {victim}")
            if delete:
                await self._api.mark_preempted(victim, PREEMPTED_CONDITION)
                await self._api.delete_pod(victim, grace_period_s=None)
            else:
                await self._api.evict(victim)

        try:
            await retry(once, WRITE)
        except (ApiError, OSError, TimeoutError, Fenced) as error:
            if isinstance(error, ApiError) and (
                error.status == 404 or (delete and error.status == 409)
            ):
                # Gone already (a deletion's 409: the UID precondition, its name now another
                # pod's; an eviction's may be a budget's conflict): room made all the same.
                return
            self._log.warning(
                "preemption_eviction_refused",
                pod=str(preemptor),
                victim=str(victim),
                error=str(error),
            )
            self.cache.drop_nomination(preemptor.uid)
            self.queue.wake()
            return
        self._metrics.preemption_victims.inc()
        self._reporter.event(victim, PREEMPTED, message)

    def _start(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run an API call of the decision loop's (an eviction) as its own task."""
        task = asyncio.create_task(work, name=name)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _unschedulable(self, uid: PodUid, pod: PodInfo, refusal: Refusal) -> None:
        message = refusal.message
        self.queue.park(uid, refusal.retry_in_s, refusal.wake_key)
        self._metrics.attempts.labels("unschedulable").inc()
        if refusal.waits_for is not None:
            self.cache.reserve(pod, refusal.waits_for)
        if refusal.quiet:
            self._log.debug("held", pod=str(pod.ref), reason=message)
            return
        self._log.info("unschedulable", pod=str(pod.ref), reason=message)
        self._reporter.unschedulable(
            pod.ref,
            message,
            pod.resource_version,
            already=pod.unschedulable,
            nominated=refusal.nominated,
        )

    def _check_gang(self, key: GroupKey) -> None:
        """A member of the gang left (deleted, or its bind refused as gone): if the gang fell
        below its minimum before it ran, release what it holds (`broken_gang`)."""
        for pod in broken_gang(self.cache, self.gangs, key):
            self._log.warning("gang_below_minimum", pod=str(pod.ref), group=str(key))
            self._start(self._evict(pod.ref), f"evict {pod.ref}")

    def _claim_freed(self, freeing: CardFreeing) -> None:
        """Reserve a card that terminating pods are about to free for the pod waiting longest
        that it would let fit, so that a newer pod (the replacement of a moved one, say) does
        not take it first; the pod is bound there once they are gone."""
        claimed = claim_freed(
            self.cache, self.gangs, freeing.node, freeing.card, self._config().policy
        )
        if claimed is None:
            return
        pod, placement = claimed
        self.cache.nominate(pod.uid, placement, self.cache.leaving(freeing.node, freeing.card))
        self.cache.reserve(pod, placement)
        self._log.info(
            "nominated_to_freed_card", pod=str(pod.ref), node=freeing.node, card=[freeing.card]
        )

    async def _evict(self, pod: PodRef) -> None:
        try:
            self._fence.check(f"evict {pod}")
            await retry(lambda: self._api.evict(pod), WRITE)
        except (ApiError, OSError, TimeoutError, Fenced) as error:
            if not isinstance(error, ApiError) or error.status != 404:
                self._log.warning("evict_failed", pod=str(pod), error=str(error))

    # -- binding cycle (concurrent) ------------------------------------------------------

    async def _bind(self, decision: _Decision) -> None:
        slot = _Slot(self._slots)
        try:
            await self._bind_once(decision, slot)
        except asyncio.CancelledError:
            self._not_bound(decision)
            raise
        finally:
            slot.release()

    def _not_bound(self, decision: _Decision) -> None:
        """Leadership lost (or shutdown) before the bind was known: whether it landed, the
        watch will say; the pod stays queued meanwhile, or a new leadership (which lists the
        pods again first) would never decide for it."""
        self.cache.forget_assumed(decision.pod.ref.uid)
        self.queue.backoff(decision.pod.ref.uid)

    async def _bind_once(self, decision: _Decision, slot: _Slot) -> None:
        """Bind, retrying the same decision on transient errors (the assumption stays, so
        a bind that succeeded unseen is never counted twice, nor its card given away)."""
        pod, node, placement = decision.pod.ref, decision.plan.node, decision.plan.placement
        log = self._log.bind(
            pod=str(pod), node=node, card=list(placement.cards) if placement else None
        )
        if decision.plan.claims is not None and not await self._bind_claims(
            decision, decision.plan.claims, slot, log
        ):
            return
        annotations = self._placement_annotations(decision)
        # A GPU pod made before gpushare labelled them comes under the placement policy
        # with the write that places it (Kubernetes 1.35 on; before, the labeller's write
        # follows).
        labels = contract.GPU_POD_LABELS if decision.pod.unlabelled else NO_LABELS
        config = self._config()
        # Not `retry`: each refusal has its own outcome below, and the last failure, too, is
        # logged and waits its delay (the assumption held meanwhile) before the requeue.
        policy = bind_policy(config.backoff_initial_s, config.backoff_max_s)
        delays = policy.backoff.delays()  # one after each failure, the last one's too
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                self._fence.check(f"bind {pod}")
                async with asyncio.timeout(config.bind_timeout_s):
                    await self._api.bind(pod, node, annotations, labels)
                break
            except Fenced as fenced:  # here, or by the client as the bytes were to go out
                self._requeue(pod, log, str(fenced))
                return
            except ApiError as error:
                if error.status == 404:  # deleted meanwhile
                    self._dropped(pod, log, error)
                    self._findings.put_nowait((DELETED, decision.pod))
                    return
                if error.status == 409:
                    if await self._landed_before(decision.pod, node, annotations, log, error):
                        break  # our own earlier attempt: bound as decided
                    return
                if not transient(error):
                    # Refused for good (an admission webhook or policy, a bad request): said
                    # on the pod as kube-scheduler says it, and tried again after a backoff.
                    reason = f"binding rejected: {error.status}: {error.message}"
                    self._requeue(pod, log, reason)
                    self._reporter.unschedulable(
                        pod,
                        reason,
                        decision.pod.resource_version,
                        already=decision.pod.unschedulable,
                    )
                    return
                failure: Exception = error
            except (TimeoutError, OSError) as unanswered:
                failure = unanswered
            delay = wait_s(next(delays), failure)
            log.warning("bind_retry", attempt=attempt, error=repr(failure), retry_in_s=delay)
            await asyncio.sleep(delay)
        else:
            self._requeue(pod, log, f"no answer after {BIND_ATTEMPTS} attempts")
            return
        self.queue.remove(pod.uid)
        self._metrics.attempts.labels("scheduled").inc()
        created = decision.pod.created_s
        if created is not None:
            self._metrics.latency.observe(max(0.0, time.time() - created))
        log.info("pod_bound", free_after=placement.free_after if placement else None)
        self._reporter.bound(pod, node, placement)

    def _placement_annotations(self, decision: _Decision) -> dict[str, str]:
        """What the Binding writes on the pod: its card(s), the time, and its gang's size."""
        placement = decision.plan.placement
        if placement is None:
            return {}
        annotations = placement.allocation(decision.pod.ref).annotations()
        annotations[contract.PREDICATE_TIME] = str(time.time_ns())
        # The Binding writes every placement annotation, so values a user forged on the
        # pending pod never stand: gpu-index is ours, and gpu-assigned starts "false".
        annotations[contract.GPU_ASSIGNED] = contract.GPU_ASSIGNED_FALSE
        if decision.pod.group is not None or decision.pod.carries_gang_min:
            spec = self.gangs.spec(decision.pod.group) if decision.pod.group else None
            gang_min = spec.min_member if isinstance(spec, GroupSpec) else 1
            annotations[contract.GANG_MIN_MEMBER] = str(min(gang_min, GANG_MIN_MEMBER_MAX))
        return annotations

    async def _bind_claims(
        self,
        decision: _Decision,
        binding: ClaimBinding,
        slot: _Slot,
        log: FilteringBoundLogger,
    ) -> bool:
        """kube-scheduler's VolumeBinding PreBind: give the pod's waiting claims their volumes
        on the node, or the node for their provisioner, then wait (the card assumed meanwhile)
        until they are bound to volumes the node reaches. False: it cannot go on, and the pod
        is tried again after a backoff."""
        pod = decision.pod.ref
        book = self.cache.volumes
        writes: list[tuple[str, Callable[[], Awaitable[Body]], Callable[[Body], object]]] = [
            (
                f"persistentvolume {bind.volume}",
                functools.partial(
                    self._api.promise_volume, bind.volume, bind.version, bind.claim, bind.claim_uid
                ),
                lambda written: book.observe_volume(volume_facts(written)),
            )
            for bind in binding.bind
            if not bind.promised
        ]
        writes += [
            (
                f"persistentvolumeclaim {claim[0]}/{claim[1]}",
                functools.partial(self._api.select_node, claim, binding.node, version),
                lambda written: book.observe_claim(claim_facts(written)),
            )
            for claim, version in binding.select
        ]
        for name, call, observe in writes:

            async def write(name: str = name, call: Callable[[], Awaitable[Body]] = call) -> Body:
                self._fence.check(f"write {name}")  # before every attempt
                return await call()

            try:
                written = await retry(write, WRITE)
            except Fenced as fenced:
                self._requeue(pod, log, str(fenced))
                return False
            except ApiError as error:
                if error.status == 409:  # it changed since the decision: decide again
                    self._requeue(pod, log, f"{name} changed: {error.message}")
                else:
                    self._volumes_not_bound(decision, log, f"{name}: {error}")
                return False
            except (OSError, TimeoutError) as error:
                self._volumes_not_bound(decision, log, f"{name}: {error!r}")
                return False
            observe(written)  # what the next decision sees, before the watch shows it
        log.info("claims_waiting", claims=[f"{ns}/{name}" for ns, name in binding.wait])
        async with slot.lent():  # binds of other pods go on meanwhile
            state = await self._claims_ready(decision, binding, log)
        if state is None:
            self.cache.claims_bound(pod.uid)
            return True
        if state:
            self._volumes_not_bound(decision, log, state)
        return False

    async def _claims_ready(
        self, decision: _Decision, binding: ClaimBinding, log: FilteringBoundLogger
    ) -> str | None:
        """None once the claims are bound to volumes the node reaches; else why the bind
        cannot go on, or "" when the pod was deleted meanwhile (nothing to say)."""
        pod = decision.pod.ref
        deadline = time.monotonic() + VOLUME_BIND_TIMEOUT_S
        while True:
            if not self.cache.holds(pod.uid):  # deleted meanwhile: its card is free already
                self.queue.remove(pod.uid)
                log.info("bind_dropped", reason="the pod was deleted while its claims waited")
                return ""
            state = self.cache.binding_state(binding)
            if state != "":
                return state
            left = deadline - time.monotonic()
            if left <= 0:
                claims = ", ".join(f"{ns}/{name}" for ns, name in binding.wait)
                return f"claims {claims} were not bound within {VOLUME_BIND_TIMEOUT_S:.0f} s"
            await self._volume_changes.wait(min(left, CLAIM_LOOK_S))

    def _volumes_not_bound(self, decision: _Decision, log: FilteringBoundLogger, why: str) -> None:
        """Said on the pod as kube-scheduler says a failed PreBind, and tried again later."""
        reason = f"binding volumes: {why}"
        self._requeue(decision.pod.ref, log, reason)
        self._reporter.unschedulable(
            decision.pod.ref,
            reason,
            decision.pod.resource_version,
            already=decision.pod.unschedulable,
        )

    async def _landed_before(
        self,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        log: FilteringBoundLogger,
        error: ApiError,
    ) -> bool:
        """After a Binding's 409: whether our own earlier attempt landed. Else it was bound
        by a previous leader the watch has not shown yet (perhaps on another card), or
        refused (a pod being deleted takes no Binding): the truth read now, so that the
        assumption never counts a card the pod does not hold."""
        body = await self._read_back(pod, log)
        if body is not None and _landed(body, node, annotations):
            return True
        if body is not None and not path(body, "spec").get("nodeName"):
            if path(body, "metadata").get("deletionTimestamp"):
                self.cache.forget_assumed(pod.uid)  # no card while it goes
                self._dropped(pod.ref, log, error)
            else:
                self._requeue(pod.ref, log, f"{error.status}: {error.message}")
            return False
        self._dropped(pod.ref, log, error)
        return False

    async def _read_back(self, pod: PodInfo, log: FilteringBoundLogger) -> Body | None:
        """The pod as the apiserver has it now, given to the intake as a finding; None when
        it is gone (`read_pod` answers None for another pod of its name too) or cannot be
        read (the watch corrects the cache then)."""
        try:
            body = await self._api.read_pod(pod.ref)
        except (ApiError, OSError, TimeoutError) as error:
            log.warning("read_back_failed", error=str(error))  # the watch will correct it
            return None
        if body is None:
            self._findings.put_nowait((DELETED, pod))
            return None
        self._findings.put_nowait((MODIFIED, PodInfo.parse(body)))
        return body

    def _dropped(self, pod: PodRef, log: FilteringBoundLogger, error: ApiError) -> None:
        self.queue.remove(pod.uid)
        self._metrics.attempts.labels("dropped").inc()
        log.info("bind_dropped", status=error.status, reason=error.message)

    def _requeue(self, pod: PodRef, log: FilteringBoundLogger, error: str) -> None:
        self.cache.forget_assumed(pod.uid)
        delay = self.queue.backoff(pod.uid)
        self._metrics.attempts.labels("error").inc()
        log.warning("bind_failed", error=error, retry_in_s=delay)

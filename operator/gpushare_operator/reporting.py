"""What people see of the scheduler's decisions: Events and the PodScheduled condition.

Bound: a `Scheduled` Event naming the node, the card and the free memory left. Not
placeable: `PodScheduled=False` with reason `Unschedulable` and a `FailedScheduling` Event
carrying the diagnosis, only when the message changes, never one per retry (as
kube-scheduler's updatePod skips unchanged conditions). A pod has one `FailedScheduling`
Event, its message and count updated as the diagnosis changes (as the event recorder
aggregates), and a new one once it would have expired (the apiserver keeps Events an hour).
The condition's lastTransitionTime moves only when it turns False.

Reports are queued and written by workers of their own, so that a burst of decisions is bound
first and explained right after, in two lanes:
- Events that stand alone (`Scheduled`, preemption, over-use): one POST each over the HTTP/2
  connection the Bindings use, up to `ANNOUNCERS` at once, as kube-scheduler's event
  broadcaster sends each from a goroutine of its own. With a few writers instead, a burst's
  Events reached the apiserver one by one, each its own etcd transaction: the apiserver went
  idle and was woken 5 to 7 times as often per pod as for kube-scheduler's, and etcd read
  1.4 times as often (docs/benchmarks.md).
- Reports on a pod that cannot be placed (its PodScheduled condition, then its
  FailedScheduling Event): a few workers (`WORKERS`), for they hold the HTTP/1.1 connections
  the Lease and the watches share.
Each lane's queue is bounded; when one overflows its oldest report is dropped and logged (the
pod itself is unaffected). A write that gets no answer, or a busy answer, is tried again for a
few seconds (`retry.WRITE`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.retry import WRITE, retry
from gpushare.model import GpuKind, Placement, PodRef, PodUid, format_card_indices
from gpushare.model.diagnosis import format_amount
from gpushare_operator.kubeapi import SchedulerApi

UNSCHEDULABLE = "Unschedulable"
FAILED_SCHEDULING = "FailedScheduling"
SCHEDULED = "Scheduled"

_Report = Callable[[], Awaitable[None]]
_T = TypeVar("_T")
EVENT_RENEW_S = 50 * 60.0
"""Events live an hour (kube-apiserver's --event-ttl): after this, a new one is created."""


@dataclass(slots=True)
class _Posted:
    name: str
    count: int
    at: float


WORKERS = 4
ANNOUNCERS = 64
"""Below the HTTP/2 connection's 100 streams (`gpushare.kube.http2.STREAMS`): Bindings keep
the rest."""


class _Lane:
    """Reports written by `workers` workers in the order they were queued."""

    def __init__(self, name: str, *, workers: int, max_queued: int) -> None:
        self.name = name
        self.workers = workers
        self.max_queued = max_queued
        self._queue: deque[tuple[PodRef, _Report]] = deque()
        self._ready = asyncio.Event()
        self._log = logs.get("reporting")

    def enqueue(self, pod: PodRef, report: _Report) -> None:
        if len(self._queue) >= self.max_queued:
            dropped, _ = self._queue.popleft()
            self._log.warning(
                "report_dropped", pod=str(dropped), lane=self.name, queued=len(self._queue)
            )
        self._queue.append((pod, report))
        self._ready.set()

    async def next(self) -> tuple[PodRef, _Report]:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        return self._queue.popleft()


class Reporter:
    def __init__(
        self,
        api: SchedulerApi,
        *,
        workers: int = WORKERS,
        announcers: int = ANNOUNCERS,
        max_queued: int = 10000,
    ) -> None:
        self._api = api
        self._last: dict[PodUid, str] = {}
        self._failed: dict[PodUid, _Posted] = {}
        self._refusals = _Lane("refusals", workers=workers, max_queued=max_queued)
        self._events = _Lane("events", workers=announcers, max_queued=max_queued)
        self._log = logs.get("reporting")

    async def run(self) -> None:
        """Write queued reports until cancelled."""
        async with asyncio.TaskGroup() as group:
            for lane in (self._refusals, self._events):
                for number in range(lane.workers):
                    group.create_task(self._work(lane), name=f"reporter {lane.name} {number}")

    async def _work(self, lane: _Lane) -> None:
        while True:
            pod, report = await lane.next()
            try:
                await report()
            except (ApiError, OSError, TimeoutError) as error:
                self._last.pop(pod.uid, None)  # reported again on its next attempt
                self._log.warning("report_failed", pod=str(pod), error=str(error))

    def unschedulable(
        self,
        pod: PodRef,
        message: str,
        resource_version: int | None,
        *,
        already: bool,
        nominated: str | None = None,
    ) -> None:
        """PodScheduled=False and a FailedScheduling event, unless the pod has changed since
        the decision (`resource_version`): a report still queued when the pod is bound must
        not mark the bound pod unschedulable (the device plugin serves only pods that the
        apiserver marked scheduled). `already`: the condition is False already. `nominated`:
        the node the pod preempted on, written as `status.nominatedNodeName` with it."""
        if self._last.get(pod.uid) == message:
            return
        self._last[pod.uid] = message

        async def report() -> None:
            version, transition = resource_version, not already
            for attempt in range(2):
                if self._last.get(pod.uid) != message:
                    # A newer reason was decided since (its own report, perhaps on another
                    # worker, writes it), or the pod was bound or forgotten: an older one
                    # written now, over a 409 or unconditionally, would stand in its place.
                    return
                try:
                    await _written(
                        functools.partial(
                            self._api.set_unschedulable,
                            pod,
                            UNSCHEDULABLE,
                            message,
                            version,
                            transition=transition,
                            nominated=nominated,
                        )
                    )
                    break
                except ApiError as error:
                    if error.status != 409:
                        raise
                # Changed since the decision: most often by this pod's own earlier report,
                # and the pod is retried only after its backoff. Still unbound, the newer
                # reason is written over the version read now; bound, nothing is.
                still_pending = None
                if attempt == 0:
                    still_pending = _pending_version(
                        await _written(functools.partial(self._api.read_pod, pod))
                    )
                if still_pending is None:
                    self._last.pop(pod.uid, None)  # its next refusal reports
                    return
                version, transition = still_pending
            await self._failed_scheduling(pod, message)

        self._refusals.enqueue(pod, report)

    async def _failed_scheduling(self, pod: PodRef, message: str) -> None:
        posted = self._failed.get(pod.uid)
        if posted is not None and time.monotonic() - posted.at < EVENT_RENEW_S:
            try:
                await _written(
                    lambda: self._api.repeat_event(
                        pod.namespace, posted.name, message=message, count=posted.count + 1
                    )
                )
            except ApiError as error:
                if error.status != 404:
                    raise
            else:
                posted.count += 1
                return
        name = await _written(
            lambda: self._api.post_event(
                pod, event_type="Warning", reason=FAILED_SCHEDULING, message=message
            )
        )
        if name:  # else its next reason posts a new one
            self._failed[pod.uid] = _Posted(name=name, count=1, at=time.monotonic())

    def bound(self, pod: PodRef, node: str, placement: Placement | None) -> None:
        self._last.pop(pod.uid, None)
        self._failed.pop(pod.uid, None)
        message = f"Successfully assigned {pod} to {node}"
        if placement is not None and placement.kind is GpuKind.MEMORY:
            free = format_amount(placement.free_after, placement.unit_mib)
            message += f", card {placement.cards[0]} ({free} free left on the card)"
        elif placement is not None:
            message += f", whole card(s) {format_card_indices(placement.cards)}"

        async def report() -> None:
            await _written(
                lambda: self._api.post_event(
                    pod, event_type="Normal", reason=SCHEDULED, message=message
                )
            )

        self._events.enqueue(pod, report)

    def event(self, pod: PodRef, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the pod (over-use, preemption), written by the workers as the rest."""
        event_type = "Warning" if warning else "Normal"

        async def report() -> None:
            await _written(
                lambda: self._api.post_event(
                    pod, event_type=event_type, reason=reason, message=message
                )
            )

        self._events.enqueue(pod, report)

    def forget(self, uid: PodUid) -> None:
        self._last.pop(uid, None)
        self._failed.pop(uid, None)


def _pending_version(pod: Mapping[str, Any] | None) -> tuple[int, bool] | None:
    """For a pod still unbound: its resourceVersion and whether PodScheduled=False would be
    new (a transition); None for a pod gone, bound, or of a version that is not a number."""
    if pod is None or (pod.get("spec") or {}).get("nodeName"):
        return None
    version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
    if not version.isdigit():
        return None
    conditions = (pod.get("status") or {}).get("conditions") or []
    already = any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions
    )
    return int(version), not already


async def _written(write: Callable[[], Awaitable[_T]]) -> _T:
    """`write()`, tried again while it has no answer or the apiserver is busy."""
    return await retry(write, WRITE)

"""What people see of the scheduler's decisions: Events and the PodScheduled condition.

Bound: a `Scheduled` Event naming the node, the card and the free memory left. Not
placeable: `PodScheduled=False` with reason `Unschedulable` and a `FailedScheduling` Event
carrying the diagnosis, only when the message changes, never one per retry (as
kube-scheduler's updatePod skips unchanged conditions). A pod has one `FailedScheduling`
Event, its message and count updated as the diagnosis changes (as the event recorder
aggregates), and a new one once it would have expired (the apiserver keeps Events an hour).
The condition's lastTransitionTime moves only when it turns False.

Reports are queued and written by workers of their own, in two lanes:
- Events that stand alone (`Scheduled`, preemption, over-use): one POST each over the HTTP/2
  connection the Bindings use, up to `EVENT_WORKERS` at once, as kube-scheduler's event
  broadcaster sends each from a goroutine of its own. With 4 writers instead, a burst's
  Scheduled Events trailed its binds by seconds (6.9 s at the median) and went out after
  them one by one into idle servers: the apiserver was woken 4 to 7.5 times as often per pod
  as for kube-scheduler's, and etcd spent 1.2 to 1.6 times its CPU per pod
  (docs/benchmarks.md).
- Reports on a pod that cannot be placed (its PodScheduled condition, then its
  FailedScheduling Event): `REFUSAL_WORKERS`, for the condition's writes and reads hold
  connections of the HTTP/1.1 pool that the Lease and the watches share.
Each lane's queue is bounded; when one overflows its oldest report is dropped and logged (the
pod itself is unaffected; a refusal dropped, or failed, is reported on the pod's next
attempt). A write that gets no answer, or a busy answer, is tried again for a few seconds
(`retry.WRITE`).
"""

from __future__ import annotations

import asyncio
import functools
import time
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


REFUSAL_WORKERS = 4
EVENT_WORKERS = 64
"""With the refusals' FailedScheduling Events, at most 68 of the HTTP/2 connection's 100
streams (`gpushare.kube.http2.STREAMS`) hold Events; the Bindings wait for a stream in turn
with them, so a burst's binds are never held to fewer than 32 at once."""


class _Lane:
    """Reports written by `workers` workers in the order they were queued; `lost` is told of
    each report dropped from a full queue or failed."""

    def __init__(
        self, name: str, *, workers: int, max_queued: int, lost: Callable[[PodRef], object]
    ) -> None:
        self.name = name
        self.workers = workers
        self.max_queued = max_queued
        self.lost = lost
        self._queue: asyncio.Queue[tuple[PodRef, _Report]] = asyncio.Queue()
        self._log = logs.get("reporting")

    def enqueue(self, pod: PodRef, report: _Report) -> None:
        if self._queue.qsize() >= self.max_queued:
            dropped, _ = self._queue.get_nowait()
            self._log.warning(
                "report_dropped", pod=str(dropped), lane=self.name, queued=self._queue.qsize()
            )
            self.lost(dropped)
        self._queue.put_nowait((pod, report))  # wakes one idle worker, not all

    async def next(self) -> tuple[PodRef, _Report]:
        return await self._queue.get()


class Reporter:
    def __init__(
        self,
        api: SchedulerApi,
        *,
        max_queued: int = 10000,
    ) -> None:
        self._api = api
        self._last: dict[PodUid, str] = {}
        self._failed: dict[PodUid, _Posted] = {}
        self._refusals = _Lane(
            "refusals",
            workers=REFUSAL_WORKERS,
            max_queued=max_queued,
            lost=lambda pod: self._last.pop(pod.uid, None),  # reported on its next attempt
        )
        self._events = _Lane(
            "events", workers=EVENT_WORKERS, max_queued=max_queued, lost=lambda _: None
        )
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
                lane.lost(pod)
                self._log.warning("report_failed", pod=str(pod), lane=lane.name, error=str(error))

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
            if self._last.get(pod.uid) == message:  # else bound meanwhile, or a newer reason
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
        # Not for a pod bound (or forgotten) while the Event was written: its record is gone.
        if name and pod.uid in self._last:  # else its next reason posts a new one
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
        """An Event on the pod (over-use, preemption), written as the Scheduled ones are."""
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

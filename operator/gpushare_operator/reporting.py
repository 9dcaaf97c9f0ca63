"""What people see of the scheduler's decisions: Events and the PodScheduled condition.

Bound: a `Scheduled` Event naming the node, the card and the free memory left. Not
placeable: `PodScheduled=False` with reason `Unschedulable` and a `FailedScheduling` Event
carrying the diagnosis. Both only when the message changes, never one per retry (as
kube-scheduler's updatePod skips unchanged conditions).
"""

from __future__ import annotations

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.model import GpuKind, Placement, PodRef, PodUid, format_card_indices
from gpushare.model.diagnosis import format_amount
from gpushare_operator.kubeapi import SchedulerApi

UNSCHEDULABLE = "Unschedulable"
FAILED_SCHEDULING = "FailedScheduling"
SCHEDULED = "Scheduled"


class Reporter:
    def __init__(self, api: SchedulerApi) -> None:
        self._api = api
        self._last: dict[PodUid, str] = {}
        self._log = logs.get("reporting")

    async def unschedulable(self, pod: PodRef, message: str) -> None:
        if self._last.get(pod.uid) == message:
            return
        self._last[pod.uid] = message
        try:
            await self._api.set_unschedulable(pod, UNSCHEDULABLE, message)
            await self._api.post_event(
                pod, kind="Warning", reason=FAILED_SCHEDULING, message=message
            )
        except ApiError as error:
            # Reported again on the next attempt; the pod itself is unaffected.
            self._last.pop(pod.uid, None)
            self._log.warning("report_failed", pod=str(pod), error=str(error))

    async def bound(self, pod: PodRef, node: str, placement: Placement | None) -> None:
        self._last.pop(pod.uid, None)
        message = f"Successfully assigned {pod} to {node}"
        if placement is not None and placement.kind is GpuKind.MEMORY:
            message += (
                f", card {placement.cards[0]} "
                f"({format_amount(placement.free_after, placement.unit_mib)} free left on the card)"
            )
        elif placement is not None:
            message += f", whole card(s) {format_card_indices(placement.cards)}"
        try:
            await self._api.post_event(pod, kind="Normal", reason=SCHEDULED, message=message)
        except ApiError as error:
            self._log.warning("report_failed", pod=str(pod), node=node, error=str(error))

    def forget(self, uid: PodUid) -> None:
        self._last.pop(uid, None)

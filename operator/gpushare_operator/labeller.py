"""Labelling the GPU pods that lack `gpushare.io/gpu-pod`: those made before gpushare labelled
GPU pods at admission, or while it was not installed. The apiserver's placement policy judges
labelled pods alone, so until then anyone who may update such a pod could edit its placement
record. A pending pod of ours gets the label with its Binding (`Scheduler`; Kubernetes 1.35
and later copy a Binding's labels to the pod: on an older apiserver the bound pod's next event
shows it unlabelled, and it is labelled here). The leader labels the others through
pods/status, one at a time (after an upgrade there may be thousands, and the binds go on
beside them). Finished pods (they hold no card) and pods being deleted are left as they are.
The intake says which pods; nothing else is decided here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.retry import LABEL, retry
from gpushare.model import PodRef, PodUid
from gpushare_operator.election import WriteFence
from gpushare_operator.kubeapi import Fenced, SchedulerApi
from gpushare_operator.scheduling.podinfo import PodInfo

NOT_FOUND = 404
INVALID = 422
"""What the apiserver answers a patch whose `metadata.uid` is not the pod's."""
FENCED_PAUSE_S = 1.0
"""How long the labeller waits after its fence said no (the elector decides meanwhile whether
this replica still leads)."""


class Labeller:
    def __init__(
        self, *, api: SchedulerApi, fence: WriteFence, binds: Callable[[PodInfo], bool]
    ) -> None:
        """`binds(pod)`: the pod is pending and ours, so its Binding will label it."""
        self._api = api
        self._fence = fence
        self._binds = binds
        self._waiting: dict[PodUid, PodRef] = {}
        self._more = asyncio.Event()
        self._log = logs.get("labeller")

    def observe(self, pod: PodInfo) -> None:
        """The pod as its latest event shows it (the intake's call)."""
        if pod.unlabelled and not (pod.finished or pod.terminating or self._binds(pod)):
            if pod.uid not in self._waiting:
                self._waiting[pod.uid] = pod.ref
                self._more.set()
        else:
            self._waiting.pop(pod.uid, None)

    def forget(self, uid: PodUid) -> None:
        self._waiting.pop(uid, None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def run(self) -> None:
        """Label the waiting pods, for ever (the leader's task: cancel to stop)."""
        labelled = 0
        while True:
            if not self._waiting:
                if labelled:
                    self._log.info("gpu_pods_labelled", count=labelled)
                    labelled = 0
                self._more.clear()
                await self._more.wait()
                continue
            pod = next(iter(self._waiting.values()))
            try:
                await retry(functools.partial(self._label, pod), LABEL)
            except Fenced:
                await asyncio.sleep(FENCED_PAUSE_S)
                continue
            except ApiError as error:  # refused: trying again as it is would not help
                self._refused(pod, error)
            else:
                labelled += 1
            self._waiting.pop(pod.uid, None)

    async def _label(self, pod: PodRef) -> None:
        self._fence.check(f"label {pod}")
        await self._api.label_gpu_pod(pod)

    def _refused(self, pod: PodRef, error: ApiError) -> None:
        if error.status == NOT_FOUND or (error.status == INVALID and "uid" in error.message):
            return  # gone, or replaced by a namesake (its UID is not the one sent)
        self._log.warning(
            "gpu_pod_not_labelled",
            pod=str(pod),
            error=error.message,
            consequence="the apiserver's placement policy does not judge its updates",
            fix="give the operator's ServiceAccount patch on pods/status (the shipped "
            "ClusterRole has it), or label it: kubectl label pod -n "
            f"{pod.namespace} {pod.name} gpushare.io/gpu-pod=true",
        )

"""The labeller: a GPU pod without the GPU pod label is labelled once, by a replica whose
Lease is fresh; a refusal is said with the fix, not tried for ever."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from builders import gpu_pod

from gpushare.kube import ApiError
from gpushare.model import PodRef
from gpushare_operator.election import WriteFence
from gpushare_operator.labeller import Labeller
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio


class Api:
    def __init__(self, refusal: ApiError | None = None) -> None:
        self.refusal = refusal
        self.labelled: list[str] = []
        self.called = asyncio.Event()

    async def label_gpu_pod(self, pod: PodRef) -> None:
        self.labelled.append(pod.name)
        self.called.set()
        if self.refusal is not None:
            raise self.refusal


def running(name: str) -> PodInfo:
    return PodInfo.parse(gpu_pod(name, 1000, node="n", index="0", phase="Running"))


async def called(api: Api) -> None:
    """Once `api` has been called and the labeller has taken the answer."""
    await asyncio.wait_for(api.called.wait(), 5)
    await asyncio.sleep(0.05)


async def test_a_pod_is_labelled_only_while_the_lease_is_fresh() -> None:
    fresh = [False]
    api = Api()
    fence = WriteFence(lambda: fresh[0])
    labeller = Labeller(api=api, fence=fence, binds=lambda _: False)  # type: ignore[arg-type]
    labeller.observe(running("train"))
    task = asyncio.create_task(labeller.run())
    try:
        await asyncio.sleep(0.1)
        assert api.labelled == []
        fresh[0] = True
        await called(api)
    finally:
        task.cancel()
    assert api.labelled == ["train"]


async def test_a_refused_label_is_said_with_the_fix_and_tried_once() -> None:
    api = Api(ApiError(403, 'pods "train" is forbidden: User cannot patch resource'))
    with structlog.testing.capture_logs() as logged:
        fence = WriteFence(lambda: True)
        labeller = Labeller(api=api, fence=fence, binds=lambda _: False)  # type: ignore[arg-type]
        labeller.observe(running("train"))
        task = asyncio.create_task(labeller.run())
        try:
            await called(api)
        finally:
            task.cancel()
    assert api.labelled == ["train"]
    (warning,) = [entry for entry in logged if entry["event"] == "gpu_pod_not_labelled"]
    assert warning["pod"] == "default/train"
    assert "forbidden" in warning["error"]
    assert "kubectl label pod -n default train gpushare.io/gpu-pod=true" in warning["fix"]


async def test_pods_whose_binding_labels_them_and_finished_pods_are_left_alone() -> None:
    api = Api()

    def binds(pod: PodInfo) -> bool:
        return pod.node is None

    fence = WriteFence(lambda: True)
    labeller = Labeller(api=api, fence=fence, binds=binds)  # type: ignore[arg-type]
    labeller.observe(PodInfo.parse(gpu_pod("pending", 1000)))
    labeller.observe(PodInfo.parse(gpu_pod("done", 1000, node="n", index="0", phase="Failed")))
    assert labeller.waiting == 0

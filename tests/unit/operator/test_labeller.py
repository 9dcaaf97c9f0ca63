"""The labeller: which GPU pods it labels (those without the GPU pod label that no Binding of
ours will label, finished pods, pods being deleted and mirrors aside), only while the Lease is
fresh; an apiserver that fails is tried again, a refusal is said with the fix, a pod gone or
replaced is let be."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from builders import gpu_pod

from gpushare.kube import ApiError
from gpushare.model import PodRef, contract
from gpushare_operator.election import WriteFence
from gpushare_operator.labeller import Labeller
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio


class Api:
    """Answers each label write with the next of `answers` (None: done), then done."""

    def __init__(self, *answers: ApiError | None) -> None:
        self.answers = list(answers)
        self.labelled: list[str] = []
        self.called = asyncio.Event()

    async def label_gpu_pod(self, pod: PodRef) -> None:
        self.labelled.append(pod.name)
        self.called.set()
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer


def labeller(api: Api, fresh: list[bool] | None = None) -> Labeller:
    """Pending pods are taken for ours, labelled by their Binding."""

    def binds(pod: PodInfo) -> bool:
        return pod.node is None

    fence = WriteFence(lambda: fresh[0] if fresh else True)
    return Labeller(api=api, fence=fence, binds=binds)  # type: ignore[arg-type]


def running(name: str, **changes: Any) -> PodInfo:
    body = gpu_pod(name, 1000, node="n", index="0", phase="Running", uid=name)
    for field, value in changes.items():
        body["metadata"][field] = value
    return PodInfo.parse(body)


async def labelling(made: Labeller, api: Api, writes: int = 1) -> None:
    """Run `made` until `api` has had `writes` writes and the labeller took the last answer."""
    task = asyncio.create_task(made.run())
    try:
        async with asyncio.timeout(5):
            while len(api.labelled) < writes:
                api.called.clear()
                await api.called.wait()
            await asyncio.sleep(0.05)
    finally:
        task.cancel()


async def test_it_labels_gpu_pods_without_the_label_that_no_binding_of_ours_labels() -> None:
    made = labeller(Api())
    made.observe(running("train"))  # bound before the upgrade (or by an apiserver before 1.35)
    made.observe(running("serving", labels=dict(contract.GPU_POD_LABELS)))
    made.observe(running("leaving", deletionTimestamp="2026-12-07T10:00:00Z"))
    made.observe(running("mirror", annotations={"kubernetes.io/config.mirror": "abc"}))
    made.observe(PodInfo.parse(gpu_pod("pending", 1000)))  # its Binding labels it
    made.observe(PodInfo.parse(gpu_pod("done", 1000, node="n", index="0", phase="Failed")))
    made.observe(PodInfo.parse(gpu_pod("plain", node="n", phase="Running")))
    assert made.waiting == 1
    made.observe(running("infer"))
    made.forget(running("infer").uid)
    relabelled = running("train", labels={contract.GPU_POD_LABEL: "yes"})
    made.observe(relabelled)
    assert made.waiting == 0


async def test_a_pod_is_labelled_only_while_the_lease_is_fresh() -> None:
    fresh, api = [False], Api()
    made = labeller(api, fresh)
    made.observe(running("train"))
    task = asyncio.create_task(made.run())
    try:
        await asyncio.sleep(0.1)
        assert api.labelled == []
    finally:
        task.cancel()
    fresh[0] = True
    await labelling(made, api)
    assert (api.labelled, made.waiting) == (["train"], 0)


async def test_an_apiserver_that_fails_is_tried_again_until_the_label_lands() -> None:
    api = Api(ApiError(503, "etcdserver: leader changed"), ApiError(429, "too many requests"))
    made = labeller(api)
    made.observe(running("train"))
    with structlog.testing.capture_logs() as logged:
        await labelling(made, api, writes=3)
    assert (api.labelled, made.waiting) == (["train"] * 3, 0)
    assert [e for e in logged if e["event"] == "gpu_pod_not_labelled"] == []


async def test_a_refused_label_is_said_with_the_fix_and_tried_once() -> None:
    api = Api(ApiError(403, 'pods "train" is forbidden: User cannot patch resource'))
    with structlog.testing.capture_logs() as logged:
        made = labeller(api)
        made.observe(running("train"))
        await labelling(made, api)
    assert (api.labelled, made.waiting) == (["train"], 0)
    (warning,) = [entry for entry in logged if entry["event"] == "gpu_pod_not_labelled"]
    assert warning["pod"] == "default/train"
    assert "forbidden" in warning["error"]
    assert "kubectl label pod -n default train gpushare.io/gpu-pod=true" in warning["fix"]


@pytest.mark.parametrize(
    "answer",
    [
        ApiError(404, 'pods "train" not found'),
        ApiError(
            422, 'Pod "train" is invalid: metadata.uid: Invalid value: "u2": field is immutable'
        ),
    ],
)
async def test_a_pod_gone_or_replaced_by_a_namesake_is_let_be(answer: ApiError) -> None:
    api = Api(answer)
    with structlog.testing.capture_logs() as logged:
        made = labeller(api)
        made.observe(running("train"))
        await labelling(made, api)
    assert (api.labelled, made.waiting) == (["train"], 0)
    assert [e for e in logged if e["event"] == "gpu_pod_not_labelled"] == []

"""Automatic defragmentation moves a pod only while this replica's Lease is fresh: a paused
leader resuming after a standby took over must not evict."""

from __future__ import annotations

from typing import Any

import pytest
from builders import gpu_pod, ready_node

from gpushare.model import contract
from gpushare.model.defrag import Defragmentation
from gpushare.model.usage import PodRef
from gpushare_operator.config import OperatorConfig
from gpushare_operator.defragmenter import Defragmenter
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.labeller import Labeller
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.queue import SchedulingQueue

pytestmark = pytest.mark.asyncio

CONFIG = OperatorConfig(
    scheduler_names=frozenset({"volcano"}), defragmentation=Defragmentation.AUTO
)


class Api:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def evict(self, pod: PodRef) -> None:
        self.evicted.append(pod.name)


def running(name: str, mib: int, card: int) -> PodInfo:
    """A pod a ReplicaSet owns, started on node n's `card`."""
    body: dict[str, Any] = gpu_pod(name, mib, node="n", index=str(card), phase="Running")
    body["metadata"]["annotations"][contract.GPU_ASSIGNED] = "true"
    body["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}
    ]
    body["metadata"]["resourceVersion"] = "5"
    return PodInfo.parse(body)


async def test_a_pod_is_moved_to_make_room_only_while_the_lease_is_fresh() -> None:
    fresh = [False]
    api = Api()
    config = lambda: CONFIG  # noqa: E731
    intake = Intake(
        cache=SchedulerCache(config=config),
        queue=SchedulingQueue(config=config),
        gangs=GangBook(),
        reporter=Reporter(api=api),  # type: ignore[arg-type]  # queued, never sent here
        labeller=Labeller(api=None, fence=WriteFence(lambda: True), binds=bool),  # type: ignore[arg-type]  # never run here
    )
    intake.node_event("ADDED", ready_node("n", 20000, 2))
    intake.pod_event("ADDED", running("small", 3000, 0))
    intake.pod_event("ADDED", running("large", 6000, 1))
    waiting = gpu_pod("waiting", 8000)
    waiting["metadata"]["resourceVersion"] = "6"
    intake.pod_event("ADDED", PodInfo.parse(waiting))  # fits once "small" joins "large"
    defragmenter = Defragmenter(
        cache=intake.cache,
        gangs=intake.gangs,
        api=api,  # type: ignore[arg-type]  # evictions are all it makes here
        reporter=Reporter(api=api),  # type: ignore[arg-type]
        metrics=SchedulerMetrics(),
        config=config,
        fence=WriteFence(lambda: fresh[0]),
    )
    await defragmenter.check()
    assert api.evicted == []  # planned, but another replica may lead now

    fresh[0] = True
    await defragmenter.check()
    assert api.evicted == ["small"]

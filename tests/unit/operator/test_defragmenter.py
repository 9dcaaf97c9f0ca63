"""Automatic defragmentation moves a pod only while this replica's Lease is fresh: a paused
leader resuming after a standby took over must not evict."""

from __future__ import annotations

from typing import Any

import pytest
from builders import gpu_pod, ready_node

from gpushare.kube.reflector import DELETED
from gpushare.model import CardIndex, GpuKind, NodeName, Placement, Policy, contract
from gpushare.model.defrag import Defragmentation
from gpushare.model.usage import PodRef, PodUid
from gpushare_operator.config import OperatorConfig
from gpushare_operator.defragmenter import Defragmenter
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.labeller import Labeller
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import Plan, plan
from gpushare_operator.scheduling.defrag import defrag_plan
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
    body: dict[str, Any] = gpu_pod(
        name, mib, node="n", index=str(card), phase="Running", uid=f"uid-{name}"
    )
    body["metadata"]["annotations"][contract.GPU_ASSIGNED] = "true"
    body["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}
    ]
    body["metadata"]["resourceVersion"] = "5"
    return PodInfo.parse(body)


def spread_cluster(api: Api, fresh: list[bool]) -> tuple[Intake, Defragmenter]:
    """Node n's two cards of 10000 MiB hold "small" (3000) and "large" (6000); "waiting" (8000)
    fits once "small" joins "large"."""
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
    waiting = gpu_pod("waiting", 8000, uid="uid-waiting")
    waiting["metadata"]["resourceVersion"] = "6"
    intake.pod_event("ADDED", PodInfo.parse(waiting))
    defragmenter = Defragmenter(
        cache=intake.cache,
        gangs=intake.gangs,
        api=api,  # type: ignore[arg-type]  # evictions are all it makes here
        reporter=Reporter(api=api),  # type: ignore[arg-type]
        metrics=SchedulerMetrics(),
        config=config,
        fence=WriteFence(lambda: fresh[0]),
    )
    return intake, defragmenter


def held_on(intake: Intake, card: int) -> set[str]:
    usage = intake.cache.ledger.node(NodeName("n"))
    assert usage is not None
    return {ref.name for ref in usage.cards[CardIndex(card)].pods.values()}


async def test_a_pod_is_moved_to_make_room_only_while_the_lease_is_fresh() -> None:
    fresh = [False]
    api = Api()
    _, defragmenter = spread_cluster(api, fresh)
    await defragmenter.check()
    assert api.evicted == []  # planned, but another replica may lead now

    fresh[0] = True
    await defragmenter.check()
    assert api.evicted == ["small"]


async def test_the_card_made_whole_is_the_waiting_pods_while_the_moved_pod_leaves() -> None:
    api = Api()
    intake, defragmenter = spread_cluster(api, [True])
    await defragmenter.check()
    assert api.evicted == ["small"]
    assert held_on(intake, 0) == {"small", "waiting"}  # reserved as "small" terminates
    newcomer = gpu_pod("newcomer", 9000)
    newcomer["metadata"]["resourceVersion"] = "10"
    late = PodInfo.parse(newcomer)
    intake.pod_event("ADDED", late)
    intake.pod_event(DELETED, running("small", 3000, 0))  # card 0 is whole again
    assert not isinstance(plan(intake.cache, late, Policy.BESTFIT), Plan)
    assert held_on(intake, 0) == {"waiting"}


async def test_a_plan_leaves_the_holds_of_waiting_pods_as_they_were() -> None:
    api = Api()
    intake, _ = spread_cluster(api, [True])
    waiting = intake.cache.pending(PodUid("uid-waiting"))
    assert waiting is not None
    elsewhere = Placement(
        node=NodeName("n"), cards=(CardIndex(1),), kind=GpuKind.MEMORY, amount=1, free_after=0
    )
    intake.cache.reserve(waiting, elsewhere)  # say a quiet wait on card 1
    defrag_plan(intake.cache, intake.gangs, Policy.BESTFIT)
    assert held_on(intake, 1) == {"large", "waiting"}


async def test_a_second_interval_moves_no_more_pods_for_a_pod_whose_card_is_being_freed() -> None:
    api = Api()
    intake, defragmenter = spread_cluster(api, [True])
    await defragmenter.check()
    assert api.evicted == ["small"]
    leaving = running("small", 3000, 0).body
    leaving["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:10Z"  # its grace period runs
    leaving["metadata"]["resourceVersion"] = "7"
    intake.pod_event("MODIFIED", PodInfo.parse(leaving))
    await defragmenter.check()
    assert api.evicted == ["small"]
    assert held_on(intake, 0) == {"small", "waiting"}

"""The intake, without an apiserver: events in, the cache, the gang book and the queue as the
decision loop then finds them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from builders import gpu_pod, ready_node

from gpushare.kube.reflector import DELETED, MODIFIED
from gpushare.model import CardIndex, NodeName
from gpushare.model.gangs import VOLCANO_GROUP_ANNOTATIONS, GroupApi, GroupKey
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.labeller import Labeller
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.queue import GangCheck, SchedulingQueue

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}))


def intake() -> Intake:
    config = lambda: CONFIG  # noqa: E731
    made = Intake(
        cache=SchedulerCache(config=config, clock=lambda: 1000.0),
        queue=SchedulingQueue(config=config, clock=lambda: 100.0),
        gangs=GangBook(),
        reporter=Reporter(api=None),  # type: ignore[arg-type]  # forget() makes no call
        labeller=Labeller(api=None, fence=WriteFence(lambda: True), binds=bool),  # type: ignore[arg-type]  # never run here
    )
    node = ready_node("n", 20000, 2)
    made.node_event("ADDED", node)
    return made


def pod(name: str, version: int, **changes: Any) -> PodInfo:
    body = gpu_pod(name, 6000, uid=name, **changes)
    body["metadata"]["resourceVersion"] = str(version)
    return PodInfo.parse(body)


def used(made: Intake, card: int) -> int:
    usage = made.cache.ledger.node(NodeName("n"))
    assert usage is not None
    return usage.cards[CardIndex(card)].used


def test_a_pending_pod_is_queued_and_a_bound_one_counted() -> None:
    made = intake()
    made.pod_event("ADDED", pod("a", 10))
    assert made.queue.pop_ready() == "a"
    made.pod_event(MODIFIED, pod("a", 11, node="n", index="1"))
    assert used(made, 1) == 6000
    assert made.queue.pop_ready() is None


def test_an_event_older_than_what_the_cache_holds_is_dropped() -> None:
    made = intake()
    made.pod_event(MODIFIED, pod("a", 11, node="n", index="0"))
    made.pod_event(MODIFIED, pod("a", 10))  # a stale watch event: still unbound there
    assert used(made, 0) == 6000
    assert made.queue.pop_ready() is None


def test_a_list_forgets_pods_it_no_longer_shows_unless_the_cache_saw_them_newer() -> None:
    made = intake()
    made.pod_event(MODIFIED, pod("gone", 5, node="n", index="0"))
    made.pod_event(MODIFIED, pod("read-back", 30, node="n", index="1"))
    made.listed_pods(set(), "20")
    assert used(made, 0) == 0
    assert used(made, 1) == 6000  # read back at 30, after the list's 20


def test_a_deleted_gang_member_queues_a_check_of_its_gang_for_the_decision_loop() -> None:
    made = intake()
    made.group_event(
        GroupApi.VOLCANO,
        "ADDED",
        {"metadata": {"name": "g", "namespace": "default"}, "spec": {"minMember": 2}},
    )
    member = gpu_pod("m", 6000, uid="m", node="n", index="0")
    member["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATIONS[0]] = "g"
    member["metadata"]["resourceVersion"] = "3"
    made.pod_event(MODIFIED, PodInfo.parse(member))
    made.pod_event(DELETED, PodInfo.gone(PodInfo.parse(member).uid))
    work = asyncio.run(asyncio.wait_for(made.queue.pop(), 1))
    assert work == GangCheck(GroupKey(GroupApi.VOLCANO, "default", "g"))


@pytest.mark.asyncio
async def test_the_schedulers_findings_go_in_as_events() -> None:
    made = intake()
    made.pod_event(MODIFIED, pod("a", 10, node="n", index="0"))
    taking = asyncio.create_task(made.take_findings())
    made.findings.put_nowait((DELETED, PodInfo.gone(pod("a", 10).uid)))
    for _ in range(100):
        await asyncio.sleep(0)
        if used(made, 0) == 0:
            break
    taking.cancel()
    assert used(made, 0) == 0


def test_a_node_that_changes_wakes_parked_pods() -> None:
    made = intake()
    made.pod_event("ADDED", pod("big", 10))
    uid = made.queue.pop_ready()
    assert uid == "big"
    made.queue.park(uid)
    assert made.queue.depth().parked == 1
    bigger = ready_node("n", 40000, 2)
    bigger["metadata"]["resourceVersion"] = "2"
    made.node_event(MODIFIED, bigger)
    assert made.queue.depth().parked == 0

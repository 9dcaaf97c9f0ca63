"""A gang that preempts, through the decision loop: the members that fit keep their cards while
the others' victims leave, so that the gang evicts once."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from decision_loop import decision_loop

from gpushare.kube.reflector import DELETED, MODIFIED
from gpushare.model import CardIndex, NodeName, PodRef, contract
from gpushare.model.gangs import VOLCANO_GROUP_ANNOTATIONS, GroupApi
from gpushare.model.usage import PodUid
from gpushare_operator.config import OperatorConfig
from gpushare_operator.intake import Intake
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio
CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}))


class Api:
    """Evictions recorded; Events and conditions accepted."""

    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def evict(self, pod: PodRef, **_: Any) -> None:
        self.evicted.append(pod.name)

    async def post_event(self, *_: Any, **__: Any) -> str:
        return "event"

    async def set_unschedulable(self, *_: Any, **__: Any) -> None:
        pass


def on_card(cache: SchedulerCache, card: int) -> set[str]:
    usage = cache.ledger.node(NodeName("n"))
    assert usage is not None
    return {ref.name for ref in usage.cards[CardIndex(card)].pods.values()}


def pod_event(intake: Intake, body: dict[str, Any], version: int, kind: str = MODIFIED) -> None:
    body["metadata"]["resourceVersion"] = str(version)
    intake.pod_event(kind, PodInfo.parse(body))


def victim(name: str, node: str, card: int, version: int) -> dict[str, Any]:
    body = gpu_pod(name, 15000, node=node, index=str(card), uid=name, phase="Running")
    body["metadata"]["annotations"][contract.GPU_ASSIGNED] = "true"
    body["metadata"]["resourceVersion"] = str(version)
    return body


def gang_operator(
    api: Api, nodes: tuple[str, ...], victims: list[dict[str, Any]], *, host_port: int = 0
) -> tuple[Scheduler, Intake]:
    """Nodes of two 20000 MiB cards holding `victims` (priority 0), and a gang of two 15000 MiB
    members of priority 100 (each binding `host_port`, if any) pending."""
    scheduler, intake = decision_loop(api, CONFIG)
    for name in nodes:
        intake.node_event("ADDED", ready_node(name, 40000, 2))
    for body in victims:
        intake.pod_event("ADDED", PodInfo.parse(body))
    group = {"metadata": {"name": "job", "namespace": "default", "resourceVersion": "3"}}
    intake.group_event(GroupApi.VOLCANO, "ADDED", group | {"spec": {"minMember": 2}})
    for i in range(2):
        member = gpu_pod(f"m{i}", 15000, uid=f"m{i}")
        member["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        member["metadata"]["creationTimestamp"] = f"2026-12-04T10:00:0{i}Z"
        member["spec"]["priority"] = 100
        if host_port:  # a hostNetwork job's: the apiserver makes its containerPort a hostPort
            member["spec"]["containers"][0]["ports"] = [
                {"containerPort": host_port, "hostPort": host_port}
            ]
        pod_event(intake, member, 10 + i, "ADDED")
    return scheduler, intake


async def test_a_gang_member_that_fits_keeps_its_card_while_another_waits_for_its_victim() -> None:
    api = Api()
    leaving = victim("v", "n", 0, 2)
    scheduler, intake = gang_operator(api, ("n",), [leaving])
    cache = intake.cache
    assert scheduler.schedule_one(PodUid("m0")) == []  # the gang preempts v for one member
    await asyncio.sleep(0)  # the eviction goes out
    assert (on_card(cache, 0), on_card(cache, 1)) == ({"v", "m1"}, {"m0"})
    leaving = copy.deepcopy(leaving)
    leaving["metadata"]["deletionTimestamp"] = "2026-12-04T10:00:10Z"
    pod_event(intake, leaving, 20)
    # Tried again while v leaves: m0, which fits without evicting anyone, keeps card 1.
    assert scheduler.schedule_one(PodUid("m1")) == []
    assert on_card(cache, 1) == {"m0"}
    newcomer = gpu_pod("c", 15000, uid="c")
    pod_event(intake, newcomer, 30, "ADDED")
    assert scheduler.schedule_one(PodUid("c")) == []  # no card for it: both are the gang's
    pod_event(intake, leaving, 40, DELETED)
    placed = scheduler.schedule_one(PodUid("m0"))
    # Bound together: m0 now, m1 on the card v left once the device plugin has assigned m0
    # (the exactness rule: the same request on two cards of a node).
    assert [d.pod.ref.name for d in placed] == ["m0"]
    assert (on_card(cache, 0), on_card(cache, 1)) == ({"m1"}, {"m0"})
    await asyncio.sleep(0)
    assert api.evicted == ["v"]  # the gang preempted once


async def test_gang_members_of_one_host_port_are_given_a_node_each() -> None:
    # Node n has two free cards, m two cards held by pods of lower priority: both members fit
    # n's cards, but only one can bind the port there; the other preempts on m.
    api = Api()
    held = [victim(f"v{card}", "m", card, 2 + card) for card in (0, 1)]
    scheduler, intake = gang_operator(api, ("n", "m"), held, host_port=29500)
    assert scheduler.schedule_one(PodUid("m0")) == []
    await asyncio.sleep(0)
    assert len(api.evicted) == 1
    assert len(on_card(intake.cache, 0) | on_card(intake.cache, 1)) == 1  # one member on n


async def test_a_gang_that_fits_no_node_with_its_host_port_evicts_nobody() -> None:
    api = Api()
    held = [victim(f"v{card}", "n", card, 2 + card) for card in (0, 1)]
    scheduler, _ = gang_operator(api, ("n",), held, host_port=29500)
    assert scheduler.schedule_one(PodUid("m0")) == []
    await asyncio.sleep(0)
    assert api.evicted == []

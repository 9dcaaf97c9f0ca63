"""The decision loop's binds, with scripted apiserver answers: a bind cut short by a lost
leadership leaves its pod queued and its card free; no Binding is sent while this replica's
Lease is stale."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from decision_loop import decision_loop

from gpushare.model import CardIndex, NodeName, PodRef
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), backoff_initial_s=5)


class Api:
    """Binds that never get an answer (the apiserver gone quiet); each one recorded."""

    def __init__(self) -> None:
        self.binds: list[str] = []
        self.sent = asyncio.Event()

    async def bind(
        self, pod: PodRef, node: str, annotations: Mapping[str, str], labels: Mapping[str, str] = {}
    ) -> None:
        self.binds.append(pod.name)
        self.sent.set()
        await asyncio.Event().wait()


class FencedAtSend(Api):
    """Its client's last check refuses every bind as it goes out (the Lease went stale while
    the bind waited for its connection)."""

    async def bind(
        self, pod: PodRef, node: str, annotations: Mapping[str, str], labels: Mapping[str, str] = {}
    ) -> None:
        self.binds.append(pod.name)
        WriteFence(lambda: False).check("POST binding")


def loop(
    may_write: bool = True, api: Api | None = None
) -> tuple[Scheduler, Intake, Api, list[float]]:
    now = [100.0]
    api = api or Api()
    scheduler, intake = decision_loop(
        api, CONFIG, queue_clock=lambda: now[0], may_write=lambda: may_write
    )
    intake.node_event("ADDED", ready_node("n", 20000, 2))
    return scheduler, intake, api, now


def pending(name: str) -> PodInfo:
    body: dict[str, Any] = gpu_pod(name, 6000, uid=name)
    body["metadata"]["resourceVersion"] = "10"
    return PodInfo.parse(body)


def held(intake: Intake) -> int:
    usage = intake.cache.ledger.node(NodeName("n"))
    assert usage is not None
    return sum(usage.cards[CardIndex(c)].used for c in (0, 1))


async def test_a_bind_cut_short_by_a_lost_leadership_leaves_the_pod_queued_and_its_card_free() -> (
    None
):
    scheduler, intake, api, now = loop()
    intake.pod_event("ADDED", pending("a"))
    running = asyncio.create_task(scheduler.run())
    await asyncio.wait_for(api.sent.wait(), 5)
    assert held(intake) == 6000  # assumed while the bind is out
    running.cancel()  # the leadership is lost: the leader's tasks are cancelled
    with pytest.raises(asyncio.CancelledError):
        await running
    assert held(intake) == 0
    assert intake.queue.pop_ready() is None  # backing off...
    now[0] += CONFIG.backoff_initial_s
    assert intake.queue.pop_ready() == "a"  # ...then decided again by the next leadership


async def decided_then_stopped(scheduler: Scheduler) -> None:
    """Run the decision loop until it has decided what is queued, then stop it."""
    running = asyncio.create_task(scheduler.run())
    for _ in range(100):
        await asyncio.sleep(0)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_no_binding_is_sent_while_the_lease_is_stale() -> None:
    scheduler, intake, api, now = loop(may_write=False)
    intake.pod_event("ADDED", pending("a"))
    await decided_then_stopped(scheduler)
    assert api.binds == []
    assert held(intake) == 0
    assert intake.queue.pop_ready() is None  # decided, not sent: backing off...
    now[0] += CONFIG.backoff_initial_s
    assert intake.queue.pop_ready() == "a"  # ...to be decided again


async def test_a_bind_fenced_as_it_goes_out_leaves_the_pod_queued_and_its_card_free() -> None:
    scheduler, intake, api, now = loop(api=FencedAtSend())
    intake.pod_event("ADDED", pending("a"))
    await decided_then_stopped(scheduler)
    assert api.binds == ["a"]  # tried once, not retried as if the apiserver had failed
    assert held(intake) == 0
    assert intake.queue.pop_ready() is None
    now[0] += CONFIG.backoff_initial_s
    assert intake.queue.pop_ready() == "a"

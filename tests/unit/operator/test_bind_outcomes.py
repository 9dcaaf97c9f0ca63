"""What a Binding's answer leaves behind: the card the pod holds in the operator's cache, and
what the pod shows (its Events and PodScheduled condition)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from decision_loop import decision_loop, run_a_while

from gpushare.kube import ApiError
from gpushare.kube.reflector import DELETED, MODIFIED
from gpushare.model import CardIndex, NodeName, PodRef, contract
from gpushare_operator.config import OperatorConfig
from gpushare_operator.intake import Intake
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio
CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), backoff_initial_s=5)


class Api:
    """A Binding answered `answer` (None: bound); the pod read back as `read`, or as the
    Binding left it when `read` is None and the Binding landed."""

    def __init__(self, answer: ApiError | None, read: dict[str, Any] | None = None) -> None:
        self.answer = answer
        self.read = read
        self.binds: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.conditions: list[str] = []

    async def bind(
        self, pod: PodRef, node: str, annotations: Mapping[str, str], labels: Mapping[str, str] = {}
    ) -> None:
        self.binds.append(pod.name)
        if self.read is None and self.answer is not None and self.answer.status == 409:
            # The first attempt landed unseen: the pod as that Binding left it.
            self.read = pending_body(pod.name, "40")
            self.read["spec"]["nodeName"] = node
            self.read["metadata"]["annotations"].update(annotations)
        if self.answer is not None:
            raise self.answer

    async def read_pod(self, pod: PodRef) -> dict[str, Any] | None:
        return copy.deepcopy(self.read)

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        self.events.append((reason, message))
        return "event"

    async def set_unschedulable(
        self, pod: PodRef, reason: str, message: str, *_: Any, **__: Any
    ) -> None:
        self.conditions.append(message)


def operator(api: Api) -> tuple[Scheduler, Intake]:
    scheduler, intake = decision_loop(api, CONFIG, queue_clock=lambda: 100.0)
    intake.node_event("ADDED", ready_node("n", 20000, 2))
    return scheduler, intake


def pending_body(name: str, version: str) -> dict[str, Any]:
    body: dict[str, Any] = gpu_pod(name, 6000, uid=name)
    body["metadata"]["resourceVersion"] = version
    return body


def held(intake: Intake) -> int:
    usage = intake.cache.ledger.node(NodeName("n"))
    assert usage is not None
    return sum(usage.cards[CardIndex(card)].used for card in (0, 1))


async def test_a_pod_being_deleted_that_refuses_its_binding_holds_no_card() -> None:
    # A finalizer keeps the pod while it is deleted: the apiserver refuses to bind it (409).
    terminating = pending_body("a", "20")
    terminating["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    terminating["metadata"]["finalizers"] = ["example.com/keep"]
    refusal = ApiError(409, "pod a is being deleted, cannot be assigned to a host")
    api = Api(refusal, terminating)
    scheduler, intake = operator(api)
    intake.pod_event("ADDED", PodInfo.parse(pending_body("a", "10")))
    await run_a_while(scheduler, intake)
    assert api.binds == ["a"]
    assert held(intake) == 0


async def test_a_binding_refused_for_good_is_said_on_the_pod() -> None:
    api = Api(ApiError(403, 'admission webhook "x.example.com" denied the request: no GPUs'))
    scheduler, intake = operator(api)
    intake.pod_event("ADDED", PodInfo.parse(pending_body("a", "10")))
    await run_a_while(scheduler, intake)
    said = 'binding rejected: 403: admission webhook "x.example.com" denied the request: no GPUs'
    assert api.conditions == [said]
    assert api.events == [("FailedScheduling", said)]
    assert held(intake) == 0


async def test_a_binding_that_landed_unseen_is_announced_when_its_retry_meets_it() -> None:
    # The first attempt's answer was lost; the retry is answered 409 by the pod it bound.
    api = Api(ApiError(409, 'pod a is already assigned to node "n"'))
    scheduler, intake = operator(api)
    intake.pod_event("ADDED", PodInfo.parse(pending_body("a", "10")))
    await run_a_while(scheduler, intake)
    assert [reason for reason, _ in api.events] == ["Scheduled"]
    assert held(intake) == 6000


async def test_a_read_back_taken_before_the_pods_deletion_does_not_bring_it_back() -> None:
    _, intake = operator(Api(None))
    bound = pending_body("a", "30")
    bound["spec"]["nodeName"] = "n"
    bound["metadata"]["annotations"] = {contract.GPU_INDEX: "0"}
    intake.pod_event(MODIFIED, PodInfo.parse(bound))
    deleted = copy.deepcopy(bound)
    deleted["metadata"]["resourceVersion"] = "31"
    intake.pod_event(DELETED, PodInfo.parse(deleted))  # the watch
    intake.pod_event(MODIFIED, PodInfo.parse(bound))  # the scheduler's read, taken before
    assert held(intake) == 0

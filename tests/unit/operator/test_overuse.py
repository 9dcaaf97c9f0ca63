"""The over-use guard evicts a container over its share once the grace ran out, only while
this replica's Lease is fresh: a paused leader resuming after a standby took over must not."""

from __future__ import annotations

import dataclasses

import pytest

from gpushare.kube import ApiError
from gpushare.kube.clock import rfc3339
from gpushare.model import contract
from gpushare.model.annotations import CardIndex
from gpushare.model.measured import ContainerUse, MeasuredUsage
from gpushare.model.overuse import OverUsePolicy
from gpushare.model.usage import PodRef, PodUid
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.overuse import OverUseGuard
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache

pytestmark = pytest.mark.asyncio

CONFIG = OperatorConfig(
    scheduler_names=frozenset({"volcano"}),
    over_use_policy=OverUsePolicy.EVICT,
    over_use_grace_s=30,
)
HOG = PodRef(namespace="team", name="hog", uid=PodUid("u-hog"))


class Api:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def evict(self, pod: PodRef) -> None:
        self.evicted.append(pod.name)


def measured_at(now: float) -> dict[str, object]:
    """node-1's GPUNode, its plugin having measured `HOG` at 3000 MiB of its 1000 at `now`."""
    use = ContainerUse(
        pod=HOG, container="main", card=CardIndex(0), used_mib=3000, granted_mib=1000
    )
    usage = MeasuredUsage(at=rfc3339(now), containers=(use,), unmapped_mib={})
    return {
        "metadata": {
            "name": "node-1",
            "annotations": {contract.MEASURED_USAGE: usage.to_annotation()},
        }
    }


async def test_a_pod_over_its_share_is_evicted_only_while_the_lease_is_fresh() -> None:
    now = [1_000_000.0]
    fresh = [False]
    api = Api()
    cache = SchedulerCache(config=lambda: CONFIG)
    guard = OverUseGuard(
        cache=cache,
        api=api,  # type: ignore[arg-type]  # evictions are all it makes here
        reporter=Reporter(api=api),  # type: ignore[arg-type]  # queued, never sent here
        metrics=SchedulerMetrics(),
        config=lambda: CONFIG,
        fence=WriteFence(lambda: fresh[0]),
        clock=lambda: now[0],
    )
    cache.observe_gpunode(measured_at(now[0]))
    await guard.check()  # over its share: the grace starts
    now[0] += CONFIG.over_use_grace_s
    cache.observe_gpunode(measured_at(now[0]))
    await guard.check()  # due, but the Lease is stale: another replica may lead
    assert api.evicted == []

    fresh[0] = True
    now[0] += 1
    cache.observe_gpunode(measured_at(now[0]))
    await guard.check()
    assert api.evicted == []  # a new grace: the leader, whichever it is, judges again

    now[0] += CONFIG.over_use_grace_s
    cache.observe_gpunode(measured_at(now[0]))
    await guard.check()
    assert api.evicted == ["hog"]


class Refusing(Api):
    def __init__(self, error: ApiError) -> None:
        super().__init__()
        self.error = error

    async def evict(self, pod: PodRef) -> None:
        raise self.error


class Events:
    def __init__(self) -> None:
        self.said: list[str] = []

    def event(self, pod: PodRef, reason: str, message: str, *, warning: bool = False) -> None:
        self.said.append(message)


async def judged(api: Api, checks: int, config: OperatorConfig = CONFIG) -> list[str]:
    """What the leader's guard says of `HOG`, over `checks` measurements one grace apart."""
    events, now = Events(), [1_000_000.0]
    cache = SchedulerCache(config=lambda: config)
    guard = OverUseGuard(
        cache=cache,
        api=api,  # type: ignore[arg-type]
        reporter=events,  # type: ignore[arg-type]
        metrics=SchedulerMetrics(),
        config=lambda: config,
        fence=WriteFence(lambda: True),
        clock=lambda: now[0],
    )
    for _ in range(checks):
        cache.observe_gpunode(measured_at(now[0]))
        await guard.check()
        now[0] += config.over_use_grace_s
    return events.said


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (429, "Its PodDisruptionBudget refused the eviction (Cannot evict pod"),
        (403, "the operator's role needs create on pods/eviction"),
        (500, "Evicting it was refused (500: etcdserver: leader changed)"),
        (404, None),  # gone already
        (409, None),  # replaced by a namesake: the UID precondition
    ],
)
async def test_a_refused_eviction_is_said_as_what_refused_it(
    status: int, expected: str | None
) -> None:
    messages = {
        429: "Cannot evict pod as it would violate the pod's disruption budget.",
        403: 'pods "hog" is forbidden: User cannot create resource "pods/eviction"',
        500: "etcdserver: leader changed",
    }
    api = Refusing(ApiError(status, messages.get(status, "no")))
    said = await judged(api, 2)
    if expected is None:
        assert said == []
        return
    (message,) = said
    assert expected in message
    assert message.endswith("tried again in 30 s")


class Budgeted(Api):
    """Every eviction refused by a PodDisruptionBudget; deletions recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    async def evict(self, pod: PodRef) -> None:
        raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")

    async def delete_pod(self, pod: PodRef, *, grace_period_s: int | None) -> None:
        self.deleted.append(f"{pod.name} in {grace_period_s} s")


async def test_a_pod_its_budgets_keep_over_its_share_is_deleted_when_the_admin_allows() -> None:
    config = dataclasses.replace(CONFIG, over_use_delete_after_s=60)
    api = Budgeted()
    said = await judged(api, 4, config)  # over at 0; refused at 30 and 60; 60 s of refusals at 90
    assert api.deleted == ["hog in 30 s"]  # the over-use grace, not its own
    assert (
        "Its eviction was refused for 60 s, past overUseDeleteAfterSeconds: deleted" in (said[-1])
    )
    assert "has been over it for 90 s" in said[-1]
    assert all("PodDisruptionBudget refused" in message for message in said[:-1])


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (429, "Too many requests, please try again later."),  # API Priority and Fairness
        (500, "etcdserver: leader changed"),
        (503, "the apiserver is shutting down"),
    ],
)
async def test_only_a_budgets_refusal_counts_toward_deleting(status: int, message: str) -> None:
    config = dataclasses.replace(CONFIG, over_use_delete_after_s=1)
    api = Refusing(ApiError(status, message))
    said = await judged(api, 5, config)
    assert len(said) == 4
    assert not any("deleted" in message or "PodDisruptionBudget" in message for message in said)

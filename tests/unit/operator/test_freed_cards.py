"""A card a terminating pod is about to free goes to the pod waiting longest that it lets fit,
not to whichever pod is decided next (a moved pod's replacement, say)."""

from __future__ import annotations

from builders import capacity_node, gpu_pod

from gpushare.model import CardIndex, NodeName, Policy
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.defrag import claim_freed
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}))
NODE = NodeName("n")


def cache() -> SchedulerCache:
    c = SchedulerCache(config=lambda: CONFIG, clock=lambda: 1000.0)
    node = capacity_node("n", 20000, 2)  # two cards of 10000
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    c.observe_node(node)
    for name, index in (("a", "0"), ("b", "1")):
        c.observe_pod(PodInfo.parse(gpu_pod(name, 6000, node="n", index=index, uid=name)))
    return c


def terminating(name: str, index: str) -> PodInfo:
    body = gpu_pod(name, 6000, node="n", index=index, uid=name)
    body["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return PodInfo.parse(body)


def pending(name: str, mib: int) -> PodInfo:
    body = gpu_pod(name, mib, uid=name)
    body["spec"]["schedulerName"] = "volcano"
    body["metadata"]["creationTimestamp"] = f"2026-12-04T00:00:0{len(name)}Z"
    return PodInfo.parse(body)


def test_the_card_a_terminating_pod_frees_is_claimed_for_the_waiting_pod_it_lets_fit() -> None:
    c = cache()
    c.observe_pod(pending("big", 8000))
    assert claim_freed(c, GangBook(), NODE, CardIndex(0), Policy.BESTFIT) is None  # none leaving
    c.observe_pod(terminating("a", "0"))
    claimed = claim_freed(c, GangBook(), NODE, CardIndex(0), Policy.BESTFIT)
    assert claimed is not None
    pod, placement = claimed
    assert str(pod.ref) == "default/big"
    assert (placement.node, placement.cards, placement.free_after) == ("n", (0,), 2000)


def test_a_waiting_pod_that_fits_elsewhere_now_or_not_even_then_is_not_claimed_for() -> None:
    c = cache()
    c.observe_pod(pending("small", 3000))  # fits on card 1 now
    c.observe_pod(pending("huge", 12000))  # larger than the card
    c.observe_pod(terminating("a", "0"))
    assert claim_freed(c, GangBook(), NODE, CardIndex(0), Policy.BESTFIT) is None

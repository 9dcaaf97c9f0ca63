"""One decision against the scheduler cache: a pod whose best card is held back by the
exactness rule waits for it, briefly, rather than taking a worse card elsewhere."""

from __future__ import annotations

from typing import Any

from builders import capacity_node, gpu_pod, gpunode_resource

from gpushare.model import CardIndex, NodeName, Policy, contract
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import QUIET_WAIT_S, Plan, Refusal, plan
from gpushare_operator.scheduling.podinfo import PodInfo

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), assignment_timeout_s=60)


def two_nodes(clock: list[float], other: tuple[str, int, int] = ("m", 30000, 1)) -> SchedulerCache:
    """n: two cards of 10000; m: one card of 30000 (or `other`: name, memory, cards). An
    unassigned 6000 pod holds n's card 0."""
    cache = SchedulerCache(config=lambda: CONFIG, clock=lambda: clock[0])
    for name, memory, cards in (("n", 20000, 2), other):
        node = capacity_node(name, memory, cards)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
        cache.observe_node(node)
    cache.observe_pod(PodInfo.parse(gpu_pod("a", 6000, node="n", index="0", uid="ua")))
    return cache


def decide(cache: SchedulerCache, name: str, mib: int) -> Plan | Refusal:
    pod = PodInfo.parse(gpu_pod(name, mib, uid=f"u{name}"))
    cache.observe_pod(pod)
    return plan(cache, pod, Policy.BESTFIT)


def assigned(name: str, mib: int, card: str) -> PodInfo:
    body = gpu_pod(name, mib, node="n", index=card, uid=f"u{name}")
    body["metadata"]["annotations"]["volcano.sh/gpu-assigned"] = "true"
    return PodInfo.parse(body)


def where(outcome: Plan | Refusal) -> tuple[str, tuple[int, ...]]:
    assert isinstance(outcome, Plan), outcome
    assert outcome.placement is not None
    return outcome.node, outcome.placement.cards


def test_a_pod_waits_quietly_for_its_best_card_rather_than_taking_a_worse_one() -> None:
    clock = [1000.0]
    cache = two_nodes(clock)
    held = decide(cache, "b", 6000)  # best fit: n card 1 (4000 left), not m card 0 (24000)
    assert isinstance(held, Refusal)
    assert held.quiet
    assert held.message.startswith("waiting for its best fit, n card 1: held back until pod")
    assert held.retry_in_s == QUIET_WAIT_S
    assert held.wake_key is not None
    cache.observe_pod(assigned("a", 6000, "0"))
    assert where(decide(cache, "b", 6000)) == ("n", (1,))


def test_a_pod_held_back_past_the_quiet_wait_takes_the_next_best_card() -> None:
    clock = [1000.0]
    cache = two_nodes(clock)
    assert isinstance(decide(cache, "b", 6000), Refusal)
    clock[0] += QUIET_WAIT_S
    assert where(decide(cache, "b", 6000)) == ("m", (0,))


def test_a_pod_waits_on_while_the_node_assigns_other_pods_and_no_longer_once_it_stalls() -> None:
    clock = [1000.0]
    cache = two_nodes(clock)
    cache.observe_pod(PodInfo.parse(gpu_pod("x", 1000, node="n", index="0", uid="ux")))
    clock[0] += 8
    cache.observe_pod(assigned("x", 1000, "0"))  # n's kubelet admits slowly, but it admits
    clock[0] += 4  # a has waited 12 s for its assignment; n assigned a pod 4 s ago
    held = decide(cache, "b", 6000)
    assert isinstance(held, Refusal)
    assert held.quiet
    assert held.retry_in_s == QUIET_WAIT_S - 4
    clock[0] += 6  # nothing assigned on n for 10 s
    assert where(decide(cache, "b", 6000)) == ("m", (0,))


def test_a_pod_held_back_takes_an_equally_good_card_elsewhere_without_waiting() -> None:
    cache = two_nodes([1000.0], other=("n2", 20000, 2))
    # n's card 1 and n2's card 0 are both idle cards of 10000: either leaves the same free
    # memory behind, so waiting for n's would gain nothing.
    assert where(decide(cache, "b", 6000)) == ("n2", (0,))


def test_other_sizes_are_not_held_back() -> None:
    cache = two_nodes([1000.0])
    assert where(decide(cache, "c", 5000)) == ("n", (1,))


def test_past_the_quiet_wait_with_nowhere_else_the_pod_is_reported_with_its_best_fit() -> None:
    clock = [1000.0]
    cache = two_nodes(clock)
    cache.observe_pod(PodInfo.parse(gpu_pod("big", 30000, node="m", index="0", uid="ubig")))
    clock[0] += QUIET_WAIT_S
    refused = decide(cache, "b", 6000)
    assert isinstance(refused, Refusal)
    assert not refused.quiet
    assert refused.message == (
        "0/2 nodes are available now; the best fit is n card 1, held back until pod "
        "default/a (same request, card 0) is assigned by the device plugin"
    )


def reserved(cache: SchedulerCache) -> PodInfo:
    """b (6000), held back from n's card 1, reserved there as the scheduler does."""
    waiting = PodInfo.parse(gpu_pod("b", 6000, uid="ub"))
    cache.observe_pod(waiting)
    held = plan(cache, waiting, Policy.BESTFIT)
    assert isinstance(held, Refusal)
    assert held.waits_for is not None
    cache.reserve(waiting, held.waits_for)
    return waiting


def test_a_waiting_pod_keeps_its_card_for_itself_until_it_is_decided_again() -> None:
    cache = two_nodes([1000.0])
    waiting = reserved(cache)
    # n's card 1 is promised to b: a later pod that would fit only beside it goes elsewhere.
    assert where(decide(cache, "c", 8000)) == ("m", (0,))
    cache.unreserve(waiting.uid)
    assert where(decide(cache, "c", 8000)) == ("n", (1,))


def test_a_reservation_ends_when_the_pod_is_bound() -> None:
    cache = two_nodes([1000.0])
    reserved(cache)
    cache.observe_pod(PodInfo.parse(gpu_pod("b", 6000, node="m", index="0", uid="ub")))
    usage = cache.ledger.node(NodeName("n"))
    assert usage is not None
    assert usage.cards[CardIndex(1)].used == 0


def test_a_pod_the_webhook_never_converted_is_told_why_it_asks_so_much_and_what_to_do() -> None:
    """Created while gpushare was uninstalled, its 1024 (MiB, meant) count devices of 512 MiB."""
    cache = SchedulerCache(config=lambda: CONFIG)
    node = capacity_node("n", 44, 2)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    cache.observe_node(node)
    inventory = gpunode_resource("n", [11264, 11264])
    inventory["spec"]["memoryUnitMiB"] = 512
    cache.observe_gpunode(inventory)
    unconverted = decide(cache, "late", 1024)
    assert isinstance(unconverted, Refusal)
    assert unconverted.message.endswith(
        f"; its volcano.sh/gpu-memory limits count devices of 512 MiB: it carries no "
        f"{contract.MEMORY_UNIT_MIB}, so gpushare's admission webhook never converted them (it "
        "was created while the webhook did not run). If they are MiB, delete the pod and "
        "create it again"
    )
    converted = gpu_pod("big", 30, uid="ubig")
    converted["metadata"]["annotations"] = {
        contract.MEMORY_UNIT_MIB: "512",
        contract.GPU_MEMORY_MIB: "cuda-container=15360",
    }
    pod = PodInfo.parse(converted)
    cache.observe_pod(pod)
    refused = plan(cache, pod, Policy.BESTFIT)
    assert isinstance(refused, Refusal)
    assert "never converted" not in refused.message


def test_a_pod_goes_only_where_the_device_plugin_serves_its_scheduler_name() -> None:
    # The operator serves "volcano" and "team-a" (say a live GPUShareConfig added it); node n's
    # plugin serves only "volcano", m's both.
    config = OperatorConfig(scheduler_names=frozenset({"volcano", "team-a"}))
    cache = SchedulerCache(config=lambda: config)
    for name, serves in (("n", ["volcano"]), ("m", ["team-a", "volcano"])):
        node = capacity_node(name, 20000, 2)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
        cache.observe_node(node)
        inventory = gpunode_resource(name, [10000, 10000])
        inventory["spec"]["schedulerNames"] = serves
        cache.observe_gpunode(inventory)
    body = gpu_pod("t", 6000, uid="ut")
    body["spec"]["schedulerName"] = "team-a"
    pod = PodInfo.parse(body)
    cache.observe_pod(pod)
    outcome = plan(cache, pod, Policy.BESTFIT)
    assert isinstance(outcome, Plan)
    assert outcome.node == "m"
    inventory = gpunode_resource("m", [10000, 10000])
    inventory["spec"]["schedulerNames"] = ["volcano"]  # its plugin restarted without team-a
    cache.observe_gpunode(inventory)
    refused = plan(cache, pod, Policy.BESTFIT)
    assert isinstance(refused, Refusal)
    assert (
        "n: its device plugin serves pods of schedulerName volcano, not team-a (add team-a to "
        "the plugin's GPUSHARE_SCHEDULER_NAMES" in refused.message
    )


def test_a_pod_is_not_placed_beside_one_holding_its_host_port_nor_past_its_pod_level_cpu() -> None:
    cache = SchedulerCache(config=lambda: CONFIG)
    node = capacity_node("n", 20000, 2)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110", "cpu": "8"}
    cache.observe_node(node)

    def binding(name: str, node: str | None = None, index: str | None = None) -> dict[str, Any]:
        body = gpu_pod(name, 1000, uid=name, node=node, index=index)
        body["spec"]["containers"][0]["ports"] = [{"containerPort": 29500, "hostPort": 29500}]
        return body

    cache.observe_pod(PodInfo.parse(binding("a", node="n", index="0")))
    second = PodInfo.parse(binding("b"))
    cache.observe_pod(second)
    refused = plan(cache, second, Policy.BESTFIT)
    assert isinstance(refused, Refusal)
    assert "node(s) didn't have free ports for the requested pod ports" in refused.message
    large = gpu_pod("c", 1000, uid="c")
    large["spec"]["resources"] = {"requests": {"cpu": "16"}}
    refused = plan(cache, PodInfo.parse(large), Policy.BESTFIT)
    assert isinstance(refused, Refusal)
    assert "Insufficient cpu" in refused.message

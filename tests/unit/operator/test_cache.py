"""The scheduler cache: assumed pods count at once, and the exactness rule."""

from __future__ import annotations

from builders import capacity_node, gpu_pod

from gpushare.model import CardIndex, NodeName, PodRequest, Policy, gpu_request
from gpushare.model.filters import node_facts
from gpushare.model.inventory import node_inventory
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.cache import PodChange, SchedulerCache
from gpushare_operator.scheduling.decision import Plan, plan
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.slim import slim_node

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), assignment_timeout_s=60)


def cache(clock: list[float]) -> SchedulerCache:
    c = SchedulerCache(config=lambda: CONFIG, clock=lambda: clock[0])
    node = capacity_node("n", 20000, 2)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    c.observe_node(node)
    return c


def test_an_assumed_pod_counts_before_the_watch_shows_it_and_a_failed_bind_undoes_it() -> None:
    c = cache([0.0])
    pod = PodInfo.parse(gpu_pod("a", 6000, uid="ua"))
    assert c.observe_pod(pod).change is PodChange.PENDING
    decided = plan(c, pod, Policy.BESTFIT)
    assert isinstance(decided, Plan)
    c.assume(pod, decided)
    usage = c.ledger.node(NodeName("n"))
    assert usage is not None
    assert usage.cards[CardIndex(0)].used == 6000
    assert c.pending(pod.uid) is None
    c.forget_assumed(pod.uid)
    assert usage.cards[CardIndex(0)].used == 0
    assert c.pending(pod.uid) is not None


def test_the_exactness_rule_holds_other_cards_until_assignment() -> None:
    clock = [1000.0]
    c = cache(clock)
    bound = gpu_pod("a", 6000, node="n", index="0", uid="ua")
    c.observe_pod(PodInfo.parse(bound))
    request: PodRequest = gpu_request(gpu_pod("b", 6000))
    check = c.card_check(request, "default")
    assert check(NodeName("n"), CardIndex(0)) is None
    reason = check(NodeName("n"), CardIndex(1))
    assert reason is not None
    assert "held back until pod default/a" in reason
    other_size = c.card_check(gpu_request(gpu_pod("c", 5000)), "default")
    assert other_size(NodeName("n"), CardIndex(1)) is None
    bound["metadata"]["annotations"]["volcano.sh/gpu-assigned"] = "true"
    seen = c.observe_pod(PodInfo.parse(bound))
    assert seen.change is PodChange.ASSIGNED
    assert seen.signature == request.signature
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is None


def test_a_node_whose_device_plugin_identifies_pods_holds_no_card_back() -> None:
    # Its plugin learns the pod of each Allocate from the kubelet's records (GPUNode
    # spec.identifiesPods): pods of one request may wait on different cards there.
    clock = [1000.0]
    c = cache(clock)
    gpunode = {
        "metadata": {"name": "n"},
        "spec": {
            "cards": [
                {"index": 0, "uuid": "GPU-0", "memoryMiB": 10000},
                {"index": 1, "uuid": "GPU-1", "memoryMiB": 10000},
            ],
            "identifiesPods": True,
        },
    }
    c.observe_gpunode(gpunode)
    c.observe_pod(PodInfo.parse(gpu_pod("a", 6000, node="n", index="0", uid="ua")))
    request = gpu_request(gpu_pod("b", 6000))
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is None
    gpunode["spec"]["identifiesPods"] = False  # type: ignore[index]  # an older plugin
    c.observe_gpunode(gpunode)
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is not None


def test_the_assignment_wait_runs_out() -> None:
    clock = [1000.0]
    c = cache(clock)
    c.observe_pod(PodInfo.parse(gpu_pod("a", 6000, node="n", index="0", uid="ua")))
    request = gpu_request(gpu_pod("b", 6000))
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is not None
    clock[0] += 61
    check = c.card_check(request, "default")
    assert check(NodeName("n"), CardIndex(1)) is None
    assert [str(ref) for ref in check.expired.values()] == ["default/a"]


def test_status_only_changes_of_a_pending_pod_do_not_requeue_it() -> None:
    c = cache([0.0])
    pod = gpu_pod("a", 1024, uid="ua")
    assert c.observe_pod(PodInfo.parse(pod)).change is PodChange.PENDING
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    assert c.observe_pod(PodInfo.parse(pod)).change is PodChange.IGNORED


def test_a_slim_node_decides_as_the_whole_node_does() -> None:
    node = capacity_node("n", 20000, 2)
    node["metadata"].update(
        labels={"zone": "a"},
        annotations={"volcano.sh/gpu-unhealthy-ids": "1"},
        uid="u-n",
        resourceVersion="7",
        managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
    )
    node["spec"] = {
        "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
        "unschedulable": True,
        "podCIDR": "10.0.0.0/24",
    }
    node["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
    ]
    node["status"]["images"] = [{"names": [f"image-{n}"], "sizeBytes": n} for n in range(50)]
    slim = slim_node(node)
    assert node_facts(slim) == node_facts(node)
    assert node_inventory(slim) == node_inventory(node)
    assert "images" not in slim["status"]
    assert "managedFields" not in slim["metadata"]


def test_a_gpu_index_edited_after_the_bind_moves_nothing_in_the_books() -> None:
    c = cache([1000.0])
    pod = gpu_pod("a", 6000, node="n", index="0", uid="ua")
    c.observe_pod(PodInfo.parse(pod))
    pod["metadata"]["annotations"]["volcano.sh/gpu-index"] = "1"  # a tenant's edit
    seen = c.observe_pod(PodInfo.parse(pod))
    usage = c.ledger.node(NodeName("n"))
    assert usage is not None
    assert usage.cards[CardIndex(0)].used == 6000
    assert usage.cards[CardIndex(1)].used == 0
    assert any("moves nothing" in problem for problem in seen.problems)
    del pod["metadata"]["annotations"]["volcano.sh/gpu-index"]  # or removed
    c.observe_pod(PodInfo.parse(pod))
    assert usage.cards[CardIndex(0)].used == 6000
    assert usage.unattributed_memory == 0


def test_a_pod_assumed_here_but_bound_by_another_leader_counts_where_that_one_put_it() -> None:
    c = cache([1000.0])
    pod = PodInfo.parse(gpu_pod("a", 6000, uid="ua"))
    c.observe_pod(pod)
    decided = plan(c, pod, Policy.BESTFIT)
    assert isinstance(decided, Plan)
    c.assume(pod, decided)  # card 0; the bind is lost with the leadership
    bound = gpu_pod("a", 6000, node="n", index="1", uid="ua")  # the next leader chose card 1
    seen = c.observe_pod(PodInfo.parse(bound))
    usage = c.ledger.node(NodeName("n"))
    assert usage is not None
    assert usage.cards[CardIndex(0)].used == 0
    assert usage.cards[CardIndex(1)].used == 6000
    assert not seen.problems


def test_an_assigned_pod_is_never_waited_for_again_whatever_its_annotations_say() -> None:
    clock = [1000.0]
    c = cache(clock)
    pod = gpu_pod("a", 6000, node="n", index="0", uid="ua")
    pod["metadata"]["annotations"]["volcano.sh/gpu-assigned"] = "true"
    c.observe_pod(PodInfo.parse(pod))
    request = gpu_request(gpu_pod("b", 6000))
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is None
    # Set back to "false" and the predicate-time far in the future: no pin comes back.
    pod["metadata"]["annotations"]["volcano.sh/gpu-assigned"] = "false"
    pod["metadata"]["annotations"]["volcano.sh/predicate-time"] = "9" * 20
    pod["metadata"]["annotations"]["volcano.sh/gpu-index"] = "0"
    c.observe_pod(PodInfo.parse(pod))
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is None


def test_the_assignment_wait_counts_from_the_caches_own_sight_not_predicate_time() -> None:
    clock = [1000.0]
    c = cache(clock)
    pod = gpu_pod("a", 6000, node="n", index="0", uid="ua")
    pod["metadata"]["annotations"]["volcano.sh/predicate-time"] = "9" * 20  # far future
    c.observe_pod(PodInfo.parse(pod))
    request = gpu_request(gpu_pod("b", 6000))
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is not None
    clock[0] += 61
    assert c.card_check(request, "default")(NodeName("n"), CardIndex(1)) is None


def test_a_pod_of_another_namespace_is_not_named_in_a_held_back_reason() -> None:
    c = cache([1000.0])
    c.observe_pod(PodInfo.parse(gpu_pod("secret-job", 6000, node="n", index="0", uid="ua")))
    request = gpu_request(gpu_pod("b", 6000))
    reason = c.card_check(request, "team-b")(NodeName("n"), CardIndex(1))
    assert reason is not None
    assert "secret-job" not in reason
    assert "a pod of another namespace (same request, card 0)" in reason


def test_the_scheduler_keeps_only_the_annotations_it_reads() -> None:
    pod = gpu_pod("a", 6000, node="n", index="0", uid="ua")
    pod["metadata"]["annotations"]["bulky"] = "x" * 262144
    kept = PodInfo.parse(pod).body["metadata"]["annotations"]
    assert kept == {"volcano.sh/gpu-index": "0"}

"""Allocate's decision: which pod and container the kubelet starts, its card, its env."""

from __future__ import annotations

from typing import Any

import pytest
from builders import gpu_pod, gpunode_resource

from gpushare.model import contract
from gpushare.model.allocation import (
    ContainerGrant,
    KubeletView,
    NoCandidate,
    match_container,
    preferred_device_ids,
    swapped_with,
)
from gpushare.model.bound import BoundPod, bound_pod
from gpushare.model.device_list import DeviceListing, DeviceListStrategy, VisibleDevices
from gpushare.model.inventory import NodeInventory, NodeName, inventory_from_spec
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodUid

MEMORY = GpuKind.MEMORY
NUMBER = GpuKind.NUMBER


def inventory(cards: list[int], unit: int = 1) -> NodeInventory:
    spec = gpunode_resource("n", cards)["spec"]
    spec["memoryUnitMiB"] = unit
    found = inventory_from_spec(NodeName("n"), spec)
    assert found is not None
    return found


def placed(
    name: str,
    memory: int | None = None,
    *,
    number: int | None = None,
    index: str | None = "0",
    at: int | None = 1,
    extra: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    assigned: str | None = None,
) -> BoundPod:
    pod = gpu_pod(name, memory, number=number, node="n", index=index, uid=name)
    if at is not None:
        pod["metadata"]["annotations"][contract.PREDICATE_TIME] = str(at)
    if assigned is not None:
        pod["metadata"]["annotations"][contract.GPU_ASSIGNED] = assigned
    pod["spec"]["containers"].extend(extra or [])
    if init:
        pod["spec"]["initContainers"] = init
    return bound_pod(pod)


def container(name: str, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {"limits": limits}, **extra}


def after_p_served_once(
    pods: list[BoundPod], view: KubeletView, *, cards: int = 2
) -> ContainerGrant:
    """The call for 10 units once "p" had its first GPU container served, the records read
    as `view`."""
    return match_container(
        pods,
        {PodUid("p"): 1},
        kind=MEMORY,
        count=10,
        inventory=inventory([100] * cards),
        kubelet=view,
    )


def test_the_guides_pod_gets_its_card_and_the_guides_env() -> None:
    grant = match_container(
        [placed("gpu-pod1", 1024)], {}, kind=MEMORY, count=1024, inventory=inventory([11178] * 8)
    )
    assert grant.pod.name == "gpu-pod1"
    assert grant.last
    assert grant.env == {
        contract.ENV_VISIBLE_DEVICES: "0",
        contract.ENV_GPU_ALLOCATED: "1024",
        contract.ENV_GPU_MEMORY_TOTAL: "11178",
    }


def test_the_memory_total_is_the_assigned_cards_not_card_0s() -> None:
    grant = match_container(
        [placed("p", 1000, index="1")],
        {},
        kind=MEMORY,
        count=1000,
        inventory=inventory([40960, 81920]),
    )
    assert grant.env[contract.ENV_GPU_MEMORY_TOTAL] == "81920"
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "1"


def test_allocated_is_reported_in_mib_when_the_unit_is_coarser() -> None:
    grant = match_container(
        [placed("p", 100)], {}, kind=MEMORY, count=100, inventory=inventory([11178], unit=10)
    )
    assert grant.env[contract.ENV_GPU_ALLOCATED] == "1000"
    assert grant.env[contract.ENV_GPU_MEMORY_TOTAL] == "11178"  # the card's MiB, not units


def test_uuids_can_name_the_card() -> None:
    grant = match_container(
        [placed("p", 1)],
        {},
        kind=MEMORY,
        count=1,
        inventory=inventory([100]),
        listing=DeviceListing(visible=VisibleDevices.UUID),
    )
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "GPU-n-0"


def test_the_oldest_predicate_time_goes_first_and_a_part_served_pod_before_all() -> None:
    pods = [placed("new", 10, at=300), placed("old", 10, at=100), placed("none", 10, at=None)]
    cards = inventory([100])
    assert match_container(pods, {}, kind=MEMORY, count=10, inventory=cards).pod.name == "old"
    two = placed("two", 10, at=500, extra=[container("b", {contract.GPU_MEMORY: "10"})])
    grant = match_container(
        [*pods, two], {PodUid("two"): 1}, kind=MEMORY, count=10, inventory=cards
    )
    assert (grant.pod.name, grant.container) == ("two", "b")


def test_a_pod_whose_next_container_asks_for_another_amount_is_passed_over() -> None:
    pods = [placed("a", 20, at=1), placed("b", 10, at=2)]
    grant = match_container(pods, {}, kind=MEMORY, count=10, inventory=inventory([100]))
    assert grant.pod.name == "b"


@pytest.mark.parametrize(
    "pod",
    [
        placed("assigned", 10, assigned="true"),
        placed("other-kind", number=1),
        bound_pod({**gpu_pod("gone", 10, node="n", index="0"), "status": {"phase": "Succeeded"}}),
    ],
)
def test_served_finished_and_other_kind_pods_are_never_candidates(pod: BoundPod) -> None:
    with pytest.raises(NoCandidate, match="no pod bound to node n waits"):
        match_container([pod], {}, kind=MEMORY, count=10, inventory=inventory([100]))


def test_a_pod_without_gpu_index_is_never_served_and_named_only_for_the_log() -> None:
    stray = bound_pod(
        {
            **gpu_pod("stray", 10, node="n"),
            "spec": {
                **gpu_pod("stray", 10, node="n")["spec"],
                "schedulerName": "default-scheduler",
            },
        }
    )
    with pytest.raises(NoCandidate) as refusal:
        match_container([stray], {}, kind=MEMORY, count=10, inventory=inventory([100]))
    message = str(refusal.value)
    assert "1 pod(s) there ask for volcano.sh/gpu-memory without volcano.sh/gpu-index" in message
    # The message reaches whichever pod the kubelet was starting: it names no pod.
    assert "stray" not in message
    assert refusal.value.pods == ("default/stray",)


@pytest.mark.parametrize(
    ("index", "reason"),
    [("9", "card 9, which the node does not have"), ("0,1", "names 2 cards"), ("x", "comma list")],
)
def test_an_annotation_the_node_cannot_honour_fails_instead_of_guessing(
    index: str, reason: str
) -> None:
    with pytest.raises(NoCandidate, match=reason):
        match_container(
            [placed("p", 10, index=index)],
            {},
            kind=MEMORY,
            count=10,
            inventory=inventory([100, 100]),
        )


def test_an_unhealthy_card_is_not_handed_out() -> None:
    cards = inventory_from_spec(
        NodeName("n"), gpunode_resource("n", [100, 100], unhealthy=(1,))["spec"]
    )
    assert cards is not None
    with pytest.raises(NoCandidate, match="unhealthy"):
        match_container([placed("p", 10, index="1")], {}, kind=MEMORY, count=10, inventory=cards)


def test_containers_are_served_in_kubelet_order_init_first() -> None:
    pod = placed(
        "p",
        10,
        extra=[container("b", {contract.GPU_MEMORY: "30"})],
        init=[container("warm", {contract.GPU_MEMORY: "5"})],
    )
    cards = inventory([100])
    served: dict[PodUid, int] = {}
    seen = []
    for count in (5, 10, 30):
        grant = match_container([pod], served, kind=MEMORY, count=count, inventory=cards)
        served[grant.pod.uid] = grant.position + 1
        seen.append((grant.container, grant.env[contract.ENV_GPU_ALLOCATED], grant.last))
    assert seen == [("warm", "5", False), ("cuda-container", "10", False), ("b", "30", True)]
    with pytest.raises(NoCandidate):
        match_container([pod], served, kind=MEMORY, count=10, inventory=cards)


def test_whole_card_containers_split_the_pods_cards() -> None:
    pod = placed(
        "p",
        number=1,
        index="1,2,3,5",
        extra=[container("b", {contract.GPU_NUMBER: "2"})],
        init=[
            container("side", {contract.GPU_NUMBER: "1"}, restartPolicy="Always"),
            container("setup", {contract.GPU_NUMBER: "3"}),
        ],
    )
    cards = inventory([100] * 6)
    served: dict[PodUid, int] = {}
    seen = {}
    for count in (1, 3, 1, 2):
        grant = match_container([pod], served, kind=NUMBER, count=count, inventory=cards)
        served[grant.pod.uid] = grant.position + 1
        seen[grant.container] = grant.env[contract.ENV_VISIBLE_DEVICES]
    # The sidecar keeps card 1; setup runs beside it on the next three; the app containers
    # share the pod's cards after the sidecar's.
    assert seen == {"side": "1", "setup": "2,3,5", "cuda-container": "2", "b": "3,5"}
    whole = match_container(
        [placed("w", number=2, index="0,1")],
        {},
        kind=NUMBER,
        count=2,
        inventory=inventory([40, 60]),
    )
    assert whole.env[contract.ENV_GPU_ALLOCATED] == "100"


def test_preferred_ids_are_on_the_pods_card_and_keep_what_must_stay() -> None:
    grant = match_container(
        [placed("p", 3, index="1")], {}, kind=MEMORY, count=3, inventory=inventory([10, 10])
    )
    available = ["0-0", "0-1", "1-9", "1-2", "1-3", "0-2"]
    assert preferred_device_ids(grant, MEMORY, available, [], 3) == ["1-2", "1-3", "1-9"]
    assert preferred_device_ids(grant, MEMORY, available, ["0-0"], 3) == ["0-0", "1-2", "1-3"]
    # When the card runs short the kubelet still gets as many ids as it asked for.
    assert preferred_device_ids(grant, MEMORY, ["1-0", "0-0", "0-1"], [], 3) == [
        "1-0",
        "0-0",
        "0-1",
    ]


def test_preferred_whole_cards_are_the_pods_uuids() -> None:
    grant = match_container(
        [placed("p", number=2, index="1,2")],
        {},
        kind=NUMBER,
        count=2,
        inventory=inventory([10] * 3),
    )
    available = ["GPU-n-0", "GPU-n-1", "GPU-n-2"]
    assert preferred_device_ids(grant, NUMBER, available, [], 2) == ["GPU-n-1", "GPU-n-2"]


def test_a_gpu_index_another_scheduler_wrote_never_wins_a_card() -> None:
    pod = gpu_pod("forged", 10, node="n", index="0", uid="forged")
    pod["spec"]["schedulerName"] = "default-scheduler"
    with pytest.raises(NoCandidate, match=r"without volcano\.sh/gpu-index") as refusal:
        match_container([bound_pod(pod)], {}, kind=MEMORY, count=10, inventory=inventory([100]))
    assert refusal.value.pods == ("default/forged",)
    grant = match_container(
        [bound_pod(pod)],
        {},
        kind=MEMORY,
        count=10,
        inventory=inventory([100]),
        schedulers=frozenset({"default-scheduler"}),
    )
    assert grant.pod.name == "forged"  # a scheduler the plugin is told to trust


def test_a_pod_created_on_the_node_directly_never_wins_a_card() -> None:
    pod = gpu_pod("direct", 10, node="n", index="0", uid="direct")
    pod["metadata"]["annotations"][contract.PREDICATE_TIME] = "1"
    del pod["status"]["conditions"]  # spec.nodeName at creation: no Binding, no PodScheduled
    with pytest.raises(NoCandidate) as refusal:
        match_container([bound_pod(pod)], {}, kind=MEMORY, count=10, inventory=inventory([100]))
    assert refusal.value.pods == ("default/direct",)


def test_no_card_is_given_on_a_guess_while_a_bypassing_pod_asks_for_the_same_count() -> None:
    direct = gpu_pod("direct", 10, node="n", uid="direct")
    del direct["status"]["conditions"]  # spec.nodeName at creation, no gpu-index
    pods = [placed("ours", 10), bound_pod(direct)]
    with pytest.raises(NoCandidate) as refusal:
        match_container(pods, {}, kind=MEMORY, count=10, inventory=inventory([100]))
    assert str(refusal.value).startswith(
        "1 pod(s) on node n asking for 10 volcano.sh/gpu-memory were not placed by the gpushare "
        "scheduler"
    )
    assert "default/" not in str(refusal.value)
    assert refusal.value.pods == ("default/direct", "default/ours")
    # Another count is not ambiguous; nor is the bypassing pod once the kubelet refused it.
    grant = match_container(
        [placed("ours", 20), bound_pod(direct)],
        {},
        kind=MEMORY,
        count=20,
        inventory=inventory([100]),
    )
    assert grant.pod.name == "ours"
    direct["status"]["phase"] = "Failed"
    grant = match_container(
        [placed("ours", 10), bound_pod(direct)],
        {},
        kind=MEMORY,
        count=10,
        inventory=inventory([100]),
    )
    assert grant.pod.name == "ours"


def test_a_pod_the_kubelet_admitted_is_never_taken_for_one_no_scheduler_placed() -> None:
    # A running pod whose gpu-index was removed and gpu-assigned set back to "false".
    pod = gpu_pod("running", 10, node="n", uid="running")
    pod["metadata"]["annotations"][contract.GPU_ASSIGNED] = "false"
    pod["status"]["phase"] = "Running"
    pod["status"]["containerStatuses"] = [{"name": "main", "ready": True}]
    grant = match_container(
        [bound_pod(pod), placed("next", 10)], {}, kind=MEMORY, count=10, inventory=inventory([100])
    )
    assert grant.pod.name == "next"  # not refused as ambiguous


def test_a_pod_this_plugin_served_whole_is_not_taken_for_an_unplaced_one() -> None:
    served = gpu_pod("served", 10, node="n", uid="served")  # its annotations edited away
    grant = match_container(
        [bound_pod(served), placed("next", 10)],
        {PodUid("served"): 1},
        kind=MEMORY,
        count=10,
        inventory=inventory([100]),
    )
    assert grant.pod.name == "next"


def test_volume_mounts_name_the_cards_in_mounts_a_pod_cannot_set() -> None:
    grant = match_container(
        [placed("p", number=2, index="1,2")],
        {},
        kind=NUMBER,
        count=2,
        inventory=inventory([10] * 3),
        listing=DeviceListing(strategy=DeviceListStrategy.VOLUME_MOUNTS),
    )
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "/var/run/nvidia-container-devices"
    assert [(m.container_path, m.host_path) for m in grant.mounts] == [
        ("/var/run/nvidia-container-devices/1", "/dev/null"),
        ("/var/run/nvidia-container-devices/2", "/dev/null"),
    ]
    envvar = match_container(
        [placed("p", number=2, index="1,2")],
        {},
        kind=NUMBER,
        count=2,
        inventory=inventory([10] * 3),
    )
    assert envvar.env[contract.ENV_VISIBLE_DEVICES] == "1,2"
    assert envvar.mounts == ()


def test_cdi_annotations_name_the_cards_as_cdi_devices_and_no_variable_gives_one() -> None:
    grant = match_container(
        [placed("p", number=2, index="1,2")],
        {},
        kind=NUMBER,
        count=2,
        inventory=inventory([10] * 3),
        listing=DeviceListing(strategy=DeviceListStrategy.CDI_ANNOTATIONS),
    )
    assert grant.annotations == {
        "cdi.k8s.io/gpushare_gpu-number": "nvidia.com/gpu=1,nvidia.com/gpu=2"
    }
    assert grant.cdi_devices == ()
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "void"
    assert grant.env[contract.ENV_GPU_ALLOCATED] == "20"
    assert grant.mounts == ()


def test_cdi_cri_names_the_cards_by_uuid_under_the_configured_kind() -> None:
    grant = match_container(
        [placed("p", 10)],
        {},
        kind=MEMORY,
        count=10,
        inventory=inventory([100]),
        listing=DeviceListing(
            strategy=DeviceListStrategy.CDI_CRI,
            visible=VisibleDevices.UUID,
            cdi_kind="example.com/card",
        ),
    )
    assert grant.cdi_devices == ("example.com/card=GPU-n-0",)
    assert grant.annotations == {}
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "void"


def test_an_admitted_pod_is_never_the_one_an_allocate_is_for() -> None:
    # The kubelet allocates every container's devices when it admits a pod: no call of its
    # can be for a pod it has admitted, even one this plugin did not serve by name.
    started = gpu_pod("started", 10, node="n", index="0", uid="started")
    started["metadata"]["annotations"][contract.PREDICATE_TIME] = "1"
    started["status"]["phase"] = "Running"
    started["status"]["containerStatuses"] = [{"name": "cuda-container", "ready": True}]
    grant = match_container(
        [bound_pod(started), placed("next", 10, at=2)],
        {},
        kind=MEMORY,
        count=10,
        inventory=inventory([100]),
    )
    assert grant.pod.name == "next"


def test_a_pod_admitted_before_the_plugin_registered_is_served_as_its_container_starts() -> None:
    # The pod reached the kubelet in the moment the plugin registered, before its devices were
    # listed: admitted with none allocated, it is asked for again as its container starts. Its
    # records show it holding none; without them, an admitted pod is never served.
    body = gpu_pod("early", 10, node="n", index="1", uid="early")
    body["status"]["containerStatuses"] = [{"name": "cuda-container", "ready": False}]
    early = bound_pod(body)
    cards = inventory([100, 100])
    view = KubeletView.listing([("default", "early", False)])
    grant = match_container([early], {}, kind=MEMORY, count=10, inventory=cards, kubelet=view)
    assert (grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]) == ("early", "1")
    with pytest.raises(NoCandidate):
        match_container([early], {}, kind=MEMORY, count=10, inventory=cards)
    holding = KubeletView.listing([("default", "early", True)])
    with pytest.raises(NoCandidate):
        match_container([early], {}, kind=MEMORY, count=10, inventory=cards, kubelet=holding)


def test_a_grant_the_kubelet_gave_another_pod_of_the_same_request_is_served_again() -> None:
    # The kubelet admitted "first" with the grant served as "second" (the call names device
    # ids, not pods): the record follows the grant, and "second" waits for its own call,
    # whatever gpu-assigned (marked when it was served) says, even if "first" is deleted.
    first = gpu_pod("first", 10, node="n", index="0", uid="first")
    first["metadata"]["annotations"][contract.PREDICATE_TIME] = "1"
    first["status"]["phase"] = "Running"
    first["status"]["containerStatuses"] = [{"name": "cuda-container"}]
    second = gpu_pod("second", 10, node="n", index="0", uid="second")
    second["metadata"]["annotations"][contract.PREDICATE_TIME] = "2"
    second["metadata"]["annotations"][contract.GPU_ASSIGNED] = "true"
    served = {PodUid("second"): 1}
    assert swapped_with(bound_pod(first), [bound_pod(first), bound_pod(second)], served) == "second"
    # A younger pod of the request, on its card (the exactness rule held the others back).
    younger = placed("younger", 10, index="0", at=3)
    grant = match_container(
        [bound_pod(second), younger],  # "first" deleted since
        {},
        kind=MEMORY,
        count=10,
        inventory=inventory([100, 100]),
        reopened=frozenset({PodUid("second")}),
    )
    assert grant.pod.name == "second"
    assert grant.env[contract.ENV_VISIBLE_DEVICES] == "0"


def test_the_kubelet_s_records_name_the_pod_it_is_admitting_whatever_its_age() -> None:
    pods = [placed("old", 10, index="0", at=1), placed("young", 10, index="1", at=2)]
    admitting_young = KubeletView.listing([("default", "young", False)])
    grant = match_container(
        pods, {}, kind=MEMORY, count=10, inventory=inventory([100, 100]), kubelet=admitting_young
    )
    assert (grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]) == ("young", "1")
    # A pod it knows whose container holds devices was admitted before: not this call's.
    both_known = KubeletView.listing([("default", "old", True), ("default", "young", False)])
    grant = match_container(
        pods, {}, kind=MEMORY, count=10, inventory=inventory([100, 100]), kubelet=both_known
    )
    assert grant.pod.name == "young"


def test_pods_the_kubelet_is_not_starting_are_not_served_and_the_reason_says_so() -> None:
    pods = [placed("a", 10, index="0"), placed("b", 10, index="1")]
    with pytest.raises(NoCandidate, match="is starting none of the pods placed there"):
        match_container(
            pods,
            {},
            kind=MEMORY,
            count=10,
            inventory=inventory([100, 100]),
            kubelet=KubeletView.listing([]),
        )


def test_two_pods_the_kubelet_may_be_starting_on_different_cards_get_no_card() -> None:
    pods = [placed("a", 10, index="0"), placed("b", 10, index="1")]
    unstarted = KubeletView.listing([("default", "a", False), ("default", "b", False)])
    with pytest.raises(NoCandidate, match="hold different cards") as refusal:
        match_container(
            pods, {}, kind=MEMORY, count=10, inventory=inventory([100, 100]), kubelet=unstarted
        )
    assert refusal.value.pods == ("default/a", "default/b")
    # Without the records, no guess either (pods of one request on different cards: the
    # operator lets them where the records name pods, or a stalled kubelet's wait ran out).
    with pytest.raises(NoCandidate, match="hold different cards"):
        match_container(pods, {}, kind=MEMORY, count=10, inventory=inventory([100, 100]))
    same_card = [placed("a", 10, index="0"), placed("b", 10, index="0")]
    grant = match_container(same_card, {}, kind=MEMORY, count=10, inventory=inventory([100]))
    assert grant.pod.name == "a"


def test_a_pod_s_containers_follow_one_another_whatever_its_records_show_of_the_first() -> None:
    # The kubelet allocates in spec order, init containers first, and lists sidecars and app
    # containers only: a plain init container after a sidecar is next once the sidecar holds
    # its devices.
    pod = placed(
        "p",
        10,
        init=[
            container("proxy", {contract.GPU_MEMORY: "5"}, restartPolicy="Always"),
            container("migrate", {contract.GPU_MEMORY: "7"}),
        ],
    )
    cards = inventory([100])
    served: dict[PodUid, int] = {}
    held = {"proxy": 0, "cuda-container": 0}
    seen = []
    for count in (5, 7, 10):
        view = KubeletView.listing([("default", "p", any(held.values()))])
        grant = match_container(
            [pod], served, kind=MEMORY, count=count, inventory=cards, kubelet=view
        )
        served[grant.pod.uid] = grant.position + 1
        held[grant.container] = count
        seen.append(grant.container)
    assert seen == ["proxy", "migrate", "cuda-container"]


def test_a_pod_known_twice_by_name_is_being_started_if_either_holds_nothing() -> None:
    # A pod replaced under its name (a StatefulSet's) while the kubelet still knows the old.
    view = KubeletView.listing([("default", "web-0", True), ("default", "web-0", False)])
    grant = match_container(
        [placed("web-0", 10)], {}, kind=MEMORY, count=10, inventory=inventory([100]), kubelet=view
    )
    assert grant.pod.name == "web-0"


def test_a_pod_served_on_a_guess_goes_on_when_the_records_come_back() -> None:
    # The records could not be read for the first container: the oldest pod was served (both
    # on card 0); the kubelet was admitting the other, and shows it now holding that grant.
    two = [container("b", {contract.GPU_MEMORY: "10"})]
    x, y = placed("x", 10, at=2, extra=two), placed("y", 10, at=1, extra=two)
    cards = inventory([100])
    first = match_container([x, y], {}, kind=MEMORY, count=10, inventory=cards)
    assert first.pod.name == "y"
    view = KubeletView.listing([("default", "x", True)])
    second = match_container(
        [x, y], {PodUid("y"): 1}, kind=MEMORY, count=10, inventory=cards, kubelet=view
    )
    assert (second.pod.name, second.container, second.env["NVIDIA_VISIBLE_DEVICES"]) == (
        "y",
        "b",
        "0",
    )


@pytest.mark.parametrize(
    ("records", "next_in_watch"),
    [
        ([("default", "p", False), ("default", "n", False)], True),  # a kubelet before 1.34
        ([("default", "n", False)], False),  # 1.34+ lists no rejected pod
        ([("default", "p", False), ("default", "n", False)], False),
    ],
    ids=["rejected-listed", "rejected-gone-next-unseen", "rejected-listed-next-unseen"],
)
def test_a_pod_the_kubelet_rejected_half_way_does_not_take_the_next_pods_call(
    records: list[tuple[str, str, bool]], next_in_watch: bool
) -> None:
    # "p" (card 0) had its first container served, then the kubelet rejected it (the topology
    # manager refusing its second, say) before its Failed status reached the watch. The call
    # is for "n" (card 1), whose one container asks for what p's second does.
    rejected = placed("p", 10, index="0", extra=[container("b", {contract.GPU_MEMORY: "10"})])
    pods = [rejected, placed("n", 10, index="1", at=2)] if next_in_watch else [rejected]
    running = placed(
        "r", 10, index="0", extra=[container("b", {contract.GPU_MEMORY: "10"})], assigned="true"
    )
    view = KubeletView.listing([*records, ("default", "r", True)])  # served before a restart
    if next_in_watch:
        grant = after_p_served_once([*pods, running], view)
        assert (grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]) == ("n", "1")
    else:
        with pytest.raises(NoCandidate, match="not in the device plugin's watch yet"):
            after_p_served_once([*pods, running], view)


def test_a_part_served_pod_goes_on_whatever_other_pods_of_its_size_hold() -> None:
    # Its first container was served: the kubelet is admitting it, container after container.
    two = placed("two", 10, index="0", extra=[container("b", {contract.GPU_MEMORY: "10"})])
    other = placed("other", 10, index="1", at=0)
    grant = match_container(
        [two, other],
        {PodUid("two"): 1},
        kind=MEMORY,
        count=10,
        inventory=inventory([100, 100]),
    )
    assert (grant.pod.name, grant.container) == ("two", "b")


def test_a_pod_rejected_after_its_plain_init_container_does_not_give_its_card_to_the_next() -> None:
    # Kubernetes 1.30 to 1.33 (the records still list a rejected pod): "p" (card 0) had its
    # plain GPU init container served, then the kubelet rejected it at its app container. It
    # admits "n" (card 1) now; the records cannot tell them apart (init containers' devices
    # are not listed): the call waits for the watch to show which failed.
    p = placed("p", 10, index="0", at=1, init=[container("warm", {contract.GPU_MEMORY: "5"})])
    n = placed("n", 10, index="1", at=2)
    view = KubeletView.listing([("default", "p", False), ("default", "n", False)])
    with pytest.raises(NoCandidate, match="hold different cards"):
        after_p_served_once([p, n], view)


def test_a_guess_over_a_plain_init_container_goes_on_when_the_records_come_back() -> None:
    # Both on card 0. The records could not be read for the init container: the oldest, "p",
    # was served while the kubelet admitted "n"; for the app container they can, and show n
    # (its init container's devices unlisted) and not p.
    init = [container("warm", {contract.GPU_MEMORY: "5"})]
    p = placed("p", 10, index="0", at=1, init=init)
    n = placed("n", 10, index="0", at=2, init=init)
    cards = inventory([100])
    first = match_container([p, n], {}, kind=MEMORY, count=5, inventory=cards)
    assert (first.pod.name, first.container) == ("p", "warm")
    view = KubeletView.listing([("default", "n", False)])
    second = after_p_served_once([p, n], view, cards=1)
    assert second.env["NVIDIA_VISIBLE_DEVICES"] == "0"


def test_a_rejected_pod_is_not_taken_as_guessed_for_a_pod_on_another_card() -> None:
    # "p" (card 0) was served its first container, then rejected (gone from the 1.34+
    # records); "n" (card 1, the same request) holds a grant served under another pod's name.
    # The kubelet admits a pod the watch does not show yet: the call waits for the watch.
    two = [container("b", {contract.GPU_MEMORY: "10"})]
    p = placed("p", 10, index="0", at=1, extra=two)
    n = placed("n", 10, index="1", at=2, extra=two)
    view = KubeletView.listing([("default", "n", True)])
    with pytest.raises(NoCandidate):
        after_p_served_once([p, n], view)

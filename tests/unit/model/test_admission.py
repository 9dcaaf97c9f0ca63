"""The admission webhook's decision: MiB limits to units, the annotations it records, and the
GPU pods it refuses at creation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import gpu_pod, gpunode_resource

from gpushare.model import Diagnosis, GpuShareError, InvalidAnnotation, Placement, contract
from gpushare.model.admission import (
    NOTHING,
    AdmissionSettings,
    LimitsIn,
    admit,
    lacks_gpu_pod_label,
    memory_asked,
    units_for,
)
from gpushare.model.allocation import NoCandidate, match_container
from gpushare.model.bound import bound_pod
from gpushare.model.inventory import NodeInventory, NodeName, inventory_from_spec
from gpushare.model.placement import Policy, place
from gpushare.model.request import GpuKind, gpu_request
from gpushare.model.usage import Ledger

SETTINGS = AdmissionSettings()


def admitted(pod: dict[str, Any], settings: AdmissionSettings = SETTINGS) -> dict[str, Any]:
    """`pod` as the apiserver stores it after the webhook (requests defaulted from limits)."""
    result = copy.deepcopy(pod)
    for container in result["spec"]["containers"]:
        resources = container["resources"]
        resources.setdefault("requests", dict(resources.get("limits", {})))
    admit(result, settings).apply(result)
    return result


def gpu_limit(pod: dict[str, Any], side: str = "limits") -> str:
    return str(pod["spec"]["containers"][0]["resources"][side][contract.GPU_MEMORY])


@pytest.mark.parametrize(
    ("mib", "units"), [(1024, 2), (1000, 2), (512, 1), (1, 1), (40960, 80), (11178, 22)]
)
def test_mib_become_whole_units_rounded_up_and_the_mib_asked_is_kept(mib: int, units: int) -> None:
    pod = admitted(gpu_pod("p", mib))
    assert gpu_limit(pod) == gpu_limit(pod, "requests") == str(units)
    assert pod["metadata"]["annotations"] == {
        contract.MEMORY_UNIT_MIB: "512",
        contract.GPU_MEMORY_MIB: f"cuda-container={mib}",
    }
    assert pod["metadata"]["labels"] == {contract.GPU_POD_LABEL: "true"}


def test_each_container_keeps_its_own_mib() -> None:
    pod = gpu_pod("p", 1024)
    pod["spec"]["initContainers"] = [
        {"name": "warm-up", "resources": {"limits": {contract.GPU_MEMORY: "300"}}}
    ]
    pod["spec"]["containers"].append(
        {"name": "sidecar", "resources": {"limits": {contract.GPU_MEMORY: "2k"}}}
    )
    done = admitted(pod)
    assert done["spec"]["initContainers"][0]["resources"]["limits"][contract.GPU_MEMORY] == "1"
    assert done["spec"]["containers"][1]["resources"]["limits"][contract.GPU_MEMORY] == "4"
    asked = memory_asked(done["metadata"]["annotations"], owner="pod default/p")
    assert asked is not None
    assert dict(asked.mib) == {"cuda-container": 1024, "sidecar": 2000, "warm-up": 300}


def test_admitting_twice_changes_nothing_the_second_time() -> None:
    once = admitted(gpu_pod("p", 3000))
    assert admit(once, SETTINGS) == NOTHING
    assert admitted(once) == once


@pytest.mark.parametrize("number", [False, True])
def test_a_gang_record_forged_at_creation_is_dropped(number: bool) -> None:
    # Only gpushare's Binding writes it; the placement policy keeps it after creation.
    pod = gpu_pod("p", None if number else 1024, number=1 if number else None)
    pod["metadata"]["annotations"] = {contract.GANG_MIN_MEMBER: "1000", "team": "a"}
    done = admitted(pod)
    assert contract.GANG_MIN_MEMBER not in done["metadata"]["annotations"]
    assert done["metadata"]["annotations"]["team"] == "a"
    assert admit(done, SETTINGS) == NOTHING


def test_a_copy_whose_limit_was_edited_in_mib_is_converted_again() -> None:
    edited = admitted(gpu_pod("p", 1024))
    edited["spec"]["containers"][0]["resources"] = {"limits": {contract.GPU_MEMORY: "2048"}}
    again = admitted(edited)
    assert gpu_limit(again) == "4"
    assert again["metadata"]["annotations"][contract.GPU_MEMORY_MIB] == "cuda-container=2048"


def test_in_units_mode_limits_stay_and_the_mib_is_recorded() -> None:
    settings = AdmissionSettings(limits_in=LimitsIn.UNITS, unit_mib=100)
    pod = admitted(gpu_pod("p", 10), settings)
    assert gpu_limit(pod) == "10"
    assert pod["metadata"]["annotations"][contract.GPU_MEMORY_MIB] == "cuda-container=1000"


def test_whole_card_pods_are_only_labelled_and_pods_without_a_gpu_are_left_alone() -> None:
    pod = gpu_pod("cards", number=2)
    cards = admitted(pod)
    assert admit(cards, SETTINGS) == NOTHING
    assert cards["metadata"].pop("labels") == {contract.GPU_POD_LABEL: "true"}
    assert cards["metadata"] == pod["metadata"]
    assert cards["spec"]["containers"][0]["resources"]["limits"] == {contract.GPU_NUMBER: "2"}
    assert admit(gpu_pod("plain"), SETTINGS) == NOTHING


@pytest.mark.parametrize("value", [None, "false", ""])
def test_a_gpu_pod_gets_the_gpu_pod_label_whatever_its_author_wrote(value: str | None) -> None:
    pod = gpu_pod("p", 1024)
    pod["metadata"]["labels"] = {"app": "train"}
    if value is not None:
        pod["metadata"]["labels"][contract.GPU_POD_LABEL] = value
    labels = admitted(pod)["metadata"]["labels"]
    assert labels == {"app": "train", contract.GPU_POD_LABEL: "true"}


def test_a_gpu_pod_lacks_the_label_until_it_carries_it_with_any_value() -> None:
    """What the operator labels: GPU pods without the label (the policy selects it with
    Exists, so any value puts a pod under it)."""
    init = gpu_pod("init")
    init["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"requests": {contract.GPU_MEMORY: "512"}}}
    ]
    assert [lacks_gpu_pod_label(p) for p in (gpu_pod("m", 1024), gpu_pod("n", number=1), init)] == [
        True,
        True,
        True,
    ]
    labelled = gpu_pod("m", 1024)
    labelled["metadata"]["labels"] = {contract.GPU_POD_LABEL: ""}
    assert not lacks_gpu_pod_label(labelled)
    assert not lacks_gpu_pod_label(gpu_pod("plain"))
    assert not lacks_gpu_pod_label({"metadata": {"labels": None}, "spec": {"containers": 3}})


@pytest.mark.parametrize(
    ("memory", "number", "message"),
    [
        ("1Gi", None, "binary suffix"),
        ("0.5", None, "not a whole number"),
        (1024, 1, "asks for both"),
    ],
)
def test_a_pod_that_could_never_run_is_refused_with_the_fix(
    memory: object, number: int | None, message: str
) -> None:
    with pytest.raises(GpuShareError, match=message):
        admit(gpu_pod("bad", memory, number=number), SETTINGS)  # type: ignore[arg-type]


def test_requests_without_limits_are_refused() -> None:
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"] = {"requests": {contract.GPU_MEMORY: "1024"}}
    with pytest.raises(GpuShareError, match="requests only"):
        admit(pod, SETTINGS)


def test_a_scheduler_name_nobody_serves_is_refused_unless_the_config_sets_ours() -> None:
    pod = gpu_pod("p", 1024)
    pod["spec"]["schedulerName"] = "default-scheduler"
    with pytest.raises(GpuShareError, match=r"Set spec\.schedulerName: volcano"):
        admit(pod, SETTINGS)
    done = admitted(pod, AdmissionSettings(set_scheduler_name=True))
    assert done["spec"]["schedulerName"] == "volcano"
    pod["spec"]["nodeName"] = "n"  # no scheduler at all: the policy says why not
    assert admit(pod, SETTINGS).scheduler_name is None
    del pod["spec"]["nodeName"]
    pod["spec"]["schedulerName"] = "someone-else"
    with pytest.raises(GpuShareError, match="'someone-else' is not served"):
        admit(pod, AdmissionSettings(set_scheduler_name=True))


@pytest.mark.parametrize(
    "annotations",
    [
        {contract.MEMORY_UNIT_MIB: "512"},
        {contract.MEMORY_UNIT_MIB: "0", contract.GPU_MEMORY_MIB: "c=1"},
        {contract.MEMORY_UNIT_MIB: "512", contract.GPU_MEMORY_MIB: "c=1,c=2"},
        {contract.MEMORY_UNIT_MIB: "512", contract.GPU_MEMORY_MIB: "c=1Gi"},
        {contract.GPU_MEMORY_MIB: "c=1"},
    ],
)
def test_annotations_edited_out_of_shape_are_refused_naming_the_fix(
    annotations: dict[str, str],
) -> None:
    with pytest.raises(InvalidAnnotation, match="delete the pod and create it again"):
        memory_asked(annotations, owner="pod default/p")


@pytest.mark.parametrize("value", ["torch", "pytorch,mxnet", "", " , ", "jax,off", "all,jax"])
def test_a_framework_limits_annotation_that_names_no_framework_is_refused(value: str) -> None:
    pod = gpu_pod("p", 1024)
    pod["metadata"]["annotations"] = {contract.FRAMEWORK_LIMITS: value}
    with pytest.raises(InvalidAnnotation, match=r"pod default/p: .*comma list of pytorch"):
        admit(pod, SETTINGS)
    for named in ("pytorch, jax", "off", "all"):
        pod["metadata"]["annotations"] = {contract.FRAMEWORK_LIMITS: named}
        admit(pod, SETTINGS)


def test_units_round_up() -> None:
    assert [units_for(mib, 512) for mib in (1, 512, 513, 1024)] == [1, 1, 2, 2]


def inventory_at(name: str, unit: int) -> NodeInventory:
    spec = gpunode_resource(name, [11178])["spec"]
    spec["memoryUnitMiB"] = unit
    found = inventory_from_spec(NodeName(name), spec)
    assert found is not None
    return found


def ledger_of(units: dict[str, int]) -> Ledger:
    ledger = Ledger()
    for name, unit in units.items():
        ledger.set_node(inventory_at(name, unit))
    return ledger


def test_a_converted_pod_goes_only_to_nodes_of_its_unit_and_says_why_not_the_others() -> None:
    request = gpu_request(admitted(gpu_pod("p", 1024)))
    ledger = ledger_of({"a-old": 1, "b-new": 512})
    found = place(ledger, request, Policy.FIRSTFIT, unit_mib=512)
    assert isinstance(found, Placement)
    assert found.node == "b-new"
    nowhere = place(ledger_of({"a-old": 1}), request, Policy.BESTFIT, unit_mib=512)
    assert isinstance(nowhere, Diagnosis)
    assert "GPU_MEMORY_FACTOR=512" in nowhere.summary()


def test_the_plugin_tells_a_container_the_mib_it_asked() -> None:
    pod = admitted(gpu_pod("p", 1000))
    pod["spec"]["nodeName"] = "n"
    pod["metadata"]["annotations"][contract.GPU_INDEX] = "0"
    pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    node = inventory_at("n", 512)
    grant = match_container([bound_pod(pod)], {}, kind=GpuKind.MEMORY, count=2, inventory=node)
    assert grant.env[contract.ENV_GPU_ALLOCATED] == "1000"
    other = inventory_at("n", 1)
    with pytest.raises(NoCandidate, match="node n runs 1 MiB per device"):
        match_container([bound_pod(pod)], {}, kind=GpuKind.MEMORY, count=2, inventory=other)


def test_an_annotation_edited_past_its_limit_tells_the_container_only_its_reservation() -> None:
    pod = admitted(gpu_pod("p", 1024))
    pod["spec"]["nodeName"] = "n"
    pod["metadata"]["annotations"][contract.GPU_INDEX] = "0"
    pod["metadata"]["annotations"][contract.GPU_MEMORY_MIB] = (
        "cuda-container=11178"  # a tenant's edit
    )
    pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    node = inventory_at("n", 512)
    grant = match_container([bound_pod(pod)], {}, kind=GpuKind.MEMORY, count=2, inventory=node)
    assert grant.env[contract.ENV_GPU_ALLOCATED] == "1024"
    assert grant.problem is not None
    assert "says 11178 MiB but its limit reserves 2 x 512 MiB" in grant.problem


@pytest.mark.parametrize("resource", [contract.GPU_MEMORY, contract.GPU_NUMBER])
def test_a_gpu_limit_of_zero_is_refused_naming_the_fix(resource: str) -> None:
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "0"}}
    with pytest.raises(GpuShareError, match=f"sets {resource}: 0, which asks for no GPU"):
        admit(pod, SETTINGS)


def test_a_request_that_differs_from_its_limit_is_refused_not_raised() -> None:
    pod = gpu_pod("p", 2048)
    pod["spec"]["containers"][0]["resources"]["requests"] = {contract.GPU_MEMORY: "1024"}
    with pytest.raises(GpuShareError, match=r"requests volcano\.sh/gpu-memory 1024 but its limit"):
        admit(pod, SETTINGS)
    pod["spec"]["containers"][0]["resources"]["requests"] = {contract.GPU_MEMORY: "2048"}
    assert admit(pod, SETTINGS).units  # equal: converted as usual

"""The node filters before the GPU fit, worded as kube-scheduler words them."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.model import InvalidQuantity
from gpushare.model.filters import node_facts, node_reason, pod_needs, unsupported
from gpushare.model.resources import pod_requests


def node(
    *,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    allocatable: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels or {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": allocatable or {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(**spec: Any) -> dict[str, Any]:
    containers = spec.pop("containers", [{"name": "c", "resources": {}}])
    return {"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": containers, **spec}}


def reason(
    pod_body: dict[str, Any], node_body: dict[str, Any], requested: dict[str, int] | None = None
) -> str | None:
    return node_reason(pod_needs(pod_body), node_facts(node_body), requested or {})


def test_a_plain_pod_fits_a_ready_node() -> None:
    assert reason(pod(), node()) is None


def test_not_ready_and_cordoned_nodes_are_skipped() -> None:
    assert reason(pod(), node(ready=False)) == "node(s) were not ready"
    assert reason(pod(), node(unschedulable=True)) == "node(s) were unschedulable"


def test_tolerating_the_unschedulable_taint_allows_a_cordoned_node() -> None:
    tolerant = pod(
        tolerations=[
            {
                "key": "node.kubernetes.io/unschedulable",
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        ]
    )
    assert reason(tolerant, node(unschedulable=True)) is None


@pytest.mark.parametrize(
    ("tolerations", "fits"),
    [
        ([], False),
        ([{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}], True),
        ([{"key": "gpu", "value": "a100"}], True),
        ([{"key": "gpu", "operator": "Equal", "value": "h100"}], False),
        ([{"key": "gpu", "operator": "Exists"}], True),
        ([{"operator": "Exists"}], True),
        ([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], False),
    ],
    ids=[
        "none",
        "exact",
        "default operator",
        "other value",
        "exists",
        "tolerate all",
        "other effect",
    ],
)
def test_hard_taints_need_a_matching_toleration(
    tolerations: list[dict[str, str]], fits: bool
) -> None:
    tainted = node(taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}])
    expected = None if fits else "node(s) had untolerated taint {gpu: a100}"
    assert reason(pod(tolerations=tolerations), tainted) == expected


def test_soft_taints_do_not_filter() -> None:
    assert reason(pod(), node(taints=[{"key": "x", "effect": "PreferNoSchedule"}])) is None
    assert reason(pod(), node(taints=[{"key": "x", "effect": "NoExecute"}])) == (
        "node(s) had untolerated taint {x}"
    )


def test_node_selector_must_match_every_label() -> None:
    selecting = pod(nodeSelector={"gpu": "a100", "zone": "a"})
    assert reason(selecting, node(labels={"gpu": "a100", "zone": "a"})) is None
    assert reason(selecting, node(labels={"gpu": "a100"})) == (
        "node(s) didn't match Pod's node affinity/selector"
    )


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


@pytest.mark.parametrize(
    ("expression", "labels", "fits"),
    [
        ({"key": "gpu", "operator": "In", "values": ["a100", "h100"]}, {"gpu": "h100"}, True),
        ({"key": "gpu", "operator": "In", "values": ["a100"]}, {"gpu": "h100"}, False),
        ({"key": "gpu", "operator": "NotIn", "values": ["a100"]}, {}, True),
        ({"key": "gpu", "operator": "Exists"}, {"gpu": ""}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": "x"}, False),
        ({"key": "cards", "operator": "Gt", "values": ["4"]}, {"cards": "8"}, True),
        ({"key": "cards", "operator": "Lt", "values": ["4"]}, {"cards": "8"}, False),
        ({"key": "cards", "operator": "Gt", "values": ["x"]}, {"cards": "8"}, False),
        ({"key": "gpu", "operator": "Sideways"}, {"gpu": "x"}, False),
    ],
)
def test_required_node_affinity_operators(
    expression: dict[str, Any], labels: dict[str, str], fits: bool
) -> None:
    result = reason(pod(affinity=affinity({"matchExpressions": [expression]})), node(labels=labels))
    assert (result is None) is fits


def test_affinity_terms_are_ored_and_match_fields_see_the_node_name() -> None:
    terms = affinity(
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    )
    assert reason(pod(affinity=terms), node()) is None
    assert reason(pod(affinity=affinity({})), node()) is not None  # an empty term matches none


def test_resources_count_requests_of_pods_already_on_the_node() -> None:
    asking = pod(
        containers=[{"name": "c", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}]
    )
    assert reason(asking, node()) is None
    assert reason(asking, node(), {"cpu": 3000}) == "Insufficient cpu"
    assert reason(asking, node(), {"memory": 8 * 2**30 - 2**29}) == "Insufficient memory"
    assert reason(pod(), node(allocatable={"pods": "2"}), {"pods": 2}) == "Too many pods"


def test_other_extended_resources_must_be_allocatable() -> None:
    asking = pod(containers=[{"name": "c", "resources": {"limits": {"example.com/fpga": "1"}}}])
    assert reason(asking, node()) == "Insufficient example.com/fpga"


def test_requests_follow_the_init_container_rule_and_add_overhead() -> None:
    body = pod(
        containers=[{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
        initContainers=[{"name": "i", "resources": {"limits": {"cpu": "2", "memory": "1Mi"}}}],
        overhead={"cpu": "250m"},
    )
    assert pod_requests(body) == {"cpu": 2250, "memory": 2**20, "pods": 1}


def test_pod_level_resources_stand_for_the_containers_sum_as_kube_scheduler_counts_them() -> None:
    body = pod(
        containers=[{"name": "a", "resources": {"requests": {"cpu": "1", "example.com/x": "1"}}}],
        # As the apiserver stores it: pod-level requests defaulted.
        resources={"limits": {"cpu": "8"}, "requests": {"cpu": "8", "hugepages-2Mi": "4Mi"}},
        overhead={"cpu": "250m"},
    )
    assert pod_requests(body) == {
        "cpu": 8250,
        "hugepages-2Mi": 4 * 2**20,
        "example.com/x": 1,
        "pods": 1,
    }
    assert reason(body, node()) == "Insufficient cpu"  # 8 cpus asked of a 4-cpu node


def test_a_host_port_held_on_the_node_filters_it_whatever_host_ip() -> None:
    def binding(port: int, **extra: Any) -> dict[str, Any]:
        ports = [{"containerPort": port, "hostPort": port, **extra}]
        return pod(containers=[{"name": "c", "resources": {}, "ports": ports}])

    held = pod_requests(binding(29500))
    assert reason(binding(29500), node(), held) == (
        "node(s) didn't have free ports for the requested pod ports"
    )
    assert reason(binding(29500, hostIP="10.0.0.2"), node(), held) is not None
    assert reason(binding(29500, protocol="UDP"), node(), held) is None
    assert reason(binding(29501), node(), held) is None
    not_on_host = pod(containers=[{"name": "c", "resources": {}, "ports": [{"containerPort": 80}]}])
    assert pod_requests(not_on_host) == {"pods": 1}


def test_an_unreadable_allocatable_filters_the_node_with_the_reason() -> None:
    result = reason(pod(), node(allocatable={"cpu": "four"}))
    assert result is not None
    assert "node n1 allocatable: cpu 'four'" in result


def test_an_unreadable_request_is_a_typed_error() -> None:
    with pytest.raises(InvalidQuantity, match="pod d/p container c: cpu 'lots'"):
        pod_needs(pod(containers=[{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]))


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        (
            {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}},
            "required pod affinity is not supported",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}
                }
            },
            "required pod anti-affinity is not supported",
        ),
        (
            {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]},
            "whenUnsatisfiable: DoNotSchedule are not supported",
        ),
    ],
    ids=["pod affinity", "pod anti-affinity", "topology spread"],
)
def test_unimplemented_constraints_are_named_never_ignored(spec: dict[str, Any], hint: str) -> None:
    found = unsupported(pod(**spec))
    assert found is not None
    assert hint in found


def test_soft_constraints_are_not_unsupported() -> None:
    soft = pod(
        affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}},
        topologySpreadConstraints=[{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}],
    )
    assert unsupported(soft) is None

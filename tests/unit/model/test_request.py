"""A pod's GPU request: limits only, kube-scheduler's init-container rule."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.model import (
    GpuKind,
    InvalidQuantity,
    InvalidRequest,
    contract,
    gpu_request,
    pod_total,
)


def container(name: str, limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}}, **extra}


def pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "d", "uid": "u"},
        "spec": {"containers": containers, "initContainers": init or []},
    }


MEM = contract.GPU_MEMORY
NUM = contract.GPU_NUMBER


def test_the_guides_pod_asks_for_1024_units_of_one_card() -> None:
    request = gpu_request(pod([container("cuda-container", {MEM: 1024})]))
    assert request.kind is GpuKind.MEMORY
    assert request.total == 1024
    assert [(c.name, c.amount) for c in request.containers] == [("cuda-container", 1024)]


def test_requests_without_limits_are_refused_with_where_to_move_them() -> None:
    body = pod([{"name": "c", "resources": {"requests": {MEM: "1024"}}}])
    with pytest.raises(InvalidRequest, match=r"move it to resources\.limits"):
        gpu_request(body)


def test_app_containers_add_up() -> None:
    request = gpu_request(pod([container("a", {MEM: 1000}), container("b", {MEM: "2k"})]))
    assert request.total == 3000
    assert [c.amount for c in request.containers] == [1000, 2000]


def test_a_large_plain_init_container_sets_the_total() -> None:
    request = gpu_request(
        pod([container("app", {MEM: 1000})], init=[container("warmup", {MEM: 4000})])
    )
    assert request.total == 4000
    assert [(c.name, c.init) for c in request.containers] == [("app", False), ("warmup", True)]


def test_sidecars_run_beside_the_app_and_beside_later_init_containers() -> None:
    request = gpu_request(
        pod(
            [container("app", {MEM: 1000})],
            init=[
                container("sidecar", {MEM: 500}, restartPolicy="Always"),
                container("late-init", {MEM: 1200}),
            ],
        )
    )
    # app + sidecar = 1500; late-init runs beside the sidecar: 1700.
    assert request.total == 1700
    assert [c.sidecar for c in request.containers] == [False, True, False]


def test_pod_total_matches_kube_scheduler_for_mixed_init_orders() -> None:
    assert pod_total([100], [(50, False), (30, True), (90, False)]) == 130
    assert pod_total([], [(10, True), (10, True)]) == 20
    assert pod_total([5], []) == 5


def test_whole_cards_are_counted_as_cards() -> None:
    request = gpu_request(pod([container("train", {NUM: "2"})]))
    assert (request.kind, request.total) == (GpuKind.NUMBER, 2)


def test_a_pod_without_gpu_limits_asks_for_nothing() -> None:
    request = gpu_request(pod([container("web", {"cpu": "1"})]))
    assert request.kind is None
    assert request.total == 0


def test_zero_limits_ask_for_nothing() -> None:
    assert gpu_request(pod([container("c", {MEM: "0"})])).kind is None


def test_both_resources_in_one_pod_are_refused() -> None:
    body = pod([container("a", {MEM: 1024}), container("b", {NUM: 1})])
    with pytest.raises(InvalidRequest, match="both") as caught:
        gpu_request(body)
    assert "pod d/p" in str(caught.value)


@pytest.mark.parametrize("raw", ["1.5", "-1", "abc", "1Gi", "10^12"])
def test_bad_limits_name_the_container(raw: str) -> None:
    with pytest.raises(InvalidQuantity, match="pod d/p container cuda"):
        gpu_request(pod([container("cuda", {MEM: raw})]))


def test_malformed_manifests_read_as_no_request_rather_than_crash() -> None:
    bodies: list[dict[str, Any]] = [
        {},
        {"spec": None},
        {"spec": {"containers": "x"}},
        {"spec": {"containers": [None, {"resources": []}]}},
    ]
    for body in bodies:
        assert gpu_request(body).kind is None


def test_signatures_equal_for_interchangeable_pods_only() -> None:
    one = gpu_request(pod([container("a", {MEM: 1024})]))
    other = gpu_request(pod([container("b", {MEM: "1024"})]))
    bigger = gpu_request(pod([container("a", {MEM: 2048})]))
    assert one.signature == other.signature
    assert one.signature != bigger.signature

"""The exactness rule, pods of other schedulers, unsupported constraints, retries, status and
live configuration, against a real apiserver."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from cluster import (
    bind_pod,
    bound,
    create_gpunode,
    create_pod,
    events_of,
    eventually,
    gpu_index,
    gpu_pod,
    read_pod,
    reasons_once_scheduled,
    unschedulable,
)
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_harness.controlplane import free_port
from gpushare_harness.operator import OperatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]


async def mark_assigned(core: client.CoreV1Api, name: str) -> None:
    """What the device plugin does once it has seen the kubelet start the pod."""
    await raw_json(
        core.patch_namespaced_pod(
            name,
            "default",
            {"metadata": {"annotations": {contract.GPU_ASSIGNED: "true"}}},
            _preload_content=False,
        )
    )


async def test_a_same_size_pod_waits_quietly_for_the_earlier_one_to_be_assigned(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    # Backoffs and retries far longer than the wait for "b" below: it must be woken by the
    # assignment itself.
    slow = {"GPUSHARE_BACKOFF_INITIAL": "60", "GPUSHARE_BACKOFF_MAX": "60"}
    operator = start_operator(GPUSHARE_LOG_LEVEL="debug", **slow)
    await create_pod(core, gpu_pod("a", 6000))
    assert gpu_index(await bound(core, "a")) == "0"
    await create_pod(core, gpu_pod("b", 6000))  # card 0 is too full: card 1, a different card
    held = operator.wait_logged("held", timeout_s=10)
    assert "held back until pod default/a (same request, card 0) is assigned" in held["reason"]
    await mark_assigned(core, "a")
    # Under the 10 s after which a held pod is tried again anyway (decision.QUIET_WAIT_S).
    assert gpu_index(await bound(core, "b", timeout_s=8)) == "1"
    # Only waiting for the rule is not a scheduling failure: nothing to alert on.
    pod = await read_pod(core, "b")
    assert all(
        c["status"] == "True" for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
    )
    assert await reasons_once_scheduled(core, "b") == ["Scheduled"]


async def test_a_same_size_pod_waits_for_its_best_card_instead_of_a_worse_one_elsewhere(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    await create_gpu_node(core, FakeGpuNode(name="m", gpu_memory=30000, gpu_number=1))
    operator = start_operator(GPUSHARE_LOG_LEVEL="debug")  # it says when it holds a pod back
    await create_pod(core, gpu_pod("a", 6000))
    assert (await bound(core, "a"))["spec"]["nodeName"] == "n"
    # Best fit is n's card 1 (4000 MiB left), held back until a is assigned; m's card would
    # leave 24000 MiB stranded beside it.
    await create_pod(core, gpu_pod("b", 6000))
    await asyncio.to_thread(
        operator.wait_logged, "held", timeout_s=10, match=lambda e: e.get("pod") == "default/b"
    )
    assert (await read_pod(core, "b"))["spec"].get("nodeName") is None
    await mark_assigned(core, "a")
    placed = await bound(core, "b")
    assert (placed["spec"]["nodeName"], gpu_index(placed)) == ("n", "1")
    assert await reasons_once_scheduled(core, "b") == ["Scheduled"]


async def test_a_pod_whose_best_card_stays_held_back_takes_the_next_best_after_a_while(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    await create_gpu_node(core, FakeGpuNode(name="m", gpu_memory=30000, gpu_number=1))
    start_operator()
    await create_pod(core, gpu_pod("a", 6000))
    await bound(core, "a")
    started = time.monotonic()
    await create_pod(core, gpu_pod("b", 6000))  # a is never assigned: no device plugin runs
    placed = await bound(core, "b", timeout_s=30)
    assert (placed["spec"]["nodeName"], gpu_index(placed)) == ("m", "0")
    assert time.monotonic() - started >= 9.5  # the quiet wait, 10 s
    assert await reasons_once_scheduled(core, "b") == ["Scheduled"]


async def test_a_pod_held_back_longer_than_a_kubelet_takes_is_reported(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    start_operator()
    await create_pod(core, gpu_pod("a", 6000))
    await bound(core, "a")
    await create_pod(core, gpu_pod("b", 6000))  # a is never assigned: no device plugin runs
    message = await unschedulable(core, "b", timeout_s=30)
    assert (
        "the best fit is n card 1, held back until pod default/a (same request, card 0) is assigned"
        in message
    )


async def test_the_wait_for_an_assignment_is_bounded(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    operator = start_operator(GPUSHARE_ASSIGNMENT_TIMEOUT="3")
    await create_pod(core, gpu_pod("a", 6000))
    await bound(core, "a")
    started = time.monotonic()
    await create_pod(core, gpu_pod("b", 6000))
    assert gpu_index(await bound(core, "b", timeout_s=20)) == "1"
    assert time.monotonic() - started >= 2.5
    waited = operator.wait_logged("assignment_wait_expired", timeout_s=5)
    assert waited["waited_for"] == "default/a"


async def test_other_schedulers_pods_count_but_are_never_touched(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=22356, gpu_number=2))
    await create_pod(core, gpu_pod("theirs", 10000, scheduler="default-scheduler"))
    await bind_pod(core, await read_pod(core, "theirs"), "n", {contract.GPU_INDEX: "0"})
    before = await read_pod(core, "theirs")
    start_operator()
    await create_pod(core, gpu_pod("ours", 2000))
    assert gpu_index(await bound(core, "ours")) == "1"  # card 0 has only 1178 MiB left
    after = await read_pod(core, "theirs")
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["metadata"].get("finalizers") is None
    assert await events_of(core, "theirs") == []


async def test_a_foreign_pod_without_gpu_index_counts_against_the_node_total(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=11178, gpu_number=1))
    await create_pod(core, gpu_pod("theirs", 10000, scheduler="default-scheduler"))
    await bind_pod(core, await read_pod(core, "theirs"), "n", {})
    operator = start_operator()
    await create_pod(core, gpu_pod("ours", 2000))
    message = await unschedulable(core, "ours")
    assert "10000 MiB held by pods without a valid gpu-index" in message
    logged = operator.wait_logged("cannot_honour", timeout_s=5)
    assert "default/theirs" in logged["problem"]


async def test_unsupported_constraints_make_the_pod_unschedulable_with_that_reason(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=11178, gpu_number=1))
    start_operator()
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "x"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    await create_pod(core, gpu_pod("anti", 1024, affinity=anti))
    message = await unschedulable(core, "anti")
    assert "required pod anti-affinity is not supported by the gpushare scheduler" in message


async def test_an_unschedulable_pod_is_retried_when_a_node_arrives_without_a_hot_loop(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="small", gpu_memory=11178, gpu_number=1))
    start_operator()
    await create_pod(core, gpu_pod("big", 40000))
    await unschedulable(core, "big")
    # Nothing changes for "big": no new event while a pod created after it is placed (the
    # decision loop has turned since, and did not try "big" again for nothing).
    await create_pod(core, gpu_pod("fits", 1024))
    await bound(core, "fits")
    warnings = [e for e in await events_of(core, "big") if e["reason"] == "FailedScheduling"]
    assert len(warnings) == 1
    await create_gpu_node(core, FakeGpuNode(name="large", gpu_memory=81559, gpu_number=1))
    assert (await bound(core, "big"))["spec"]["nodeName"] == "large"


async def test_a_waiting_pod_has_one_failed_scheduling_event_counting_each_new_reason(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="small", gpu_memory=11178, gpu_number=1))
    start_operator()
    await create_pod(core, gpu_pod("big", 40000))
    first = await unschedulable(core, "big")
    became = await read_pod(core, "big")
    await create_gpu_node(core, FakeGpuNode(name="medium", gpu_memory=22356, gpu_number=1))

    async def rediagnosed() -> dict[str, Any] | None:
        pod = await read_pod(core, "big")
        (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        return condition if "medium" in condition["message"] else None

    condition = await eventually(rediagnosed, what="a diagnosis naming the new node")
    (before,) = [c for c in became["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["lastTransitionTime"] == before["lastTransitionTime"]

    async def counted() -> list[dict[str, Any]] | None:
        found = [e for e in await events_of(core, "big") if e["reason"] == "FailedScheduling"]
        return found if found and found[0].get("count") == 2 else None

    (event,) = await eventually(counted, what="the event counted twice")
    assert event["message"] == condition["message"] != first


async def test_gpunode_status_shows_allocation_per_card(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=122519, gpu_number=2))
    objects = client.CustomObjectsApi(api)
    await create_gpunode(api, "n", [81559, 40960])
    start_operator()
    await create_pod(core, gpu_pod("p", 30000))
    await bound(core, "p")

    async def status() -> dict[str, Any] | None:
        body = await raw_json(
            objects.get_cluster_custom_object(
                "gpushare.io", "v1alpha1", "gpunodes", "n", _preload_content=False
            )
        )
        found: dict[str, Any] | None = body.get("status")
        return found if found and found.get("allocatedMiB") else None

    shown = await eventually(status, what="the GPUNode status")
    assert shown["totalMiB"] == 122519
    assert shown["allocatedMiB"] == 30000
    assert shown["cards"][1] == {
        "index": 1,
        "healthy": True,
        "allocatedMiB": 30000,
        "freeMiB": 10960,
        "pods": ["default/p"],
    }


async def create_config(api: client.ApiClient, spec: dict[str, Any]) -> None:
    config = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GPUShareConfig",
        "metadata": {"name": "default"},
        "spec": spec,
    }
    await raw_json(
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "gpushare.io", "v1alpha1", "gpushareconfigs", config, _preload_content=False
        )
    )


async def test_a_scheduler_name_served_live_takes_the_pods_already_waiting_for_it(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=22356, gpu_number=2))
    await create_pod(core, gpu_pod("early", 2000, scheduler="team-a"))
    start_operator()
    await create_pod(core, gpu_pod("served", 2000))
    await bound(core, "served")  # the operator is running, and "early" is not its pod yet
    assert (await read_pod(core, "early"))["spec"].get("nodeName") is None
    await create_config(api, {"schedulerNames": ["volcano", "team-a"]})
    assert gpu_index(await bound(core, "early")) in {"0", "1"}


async def test_live_configuration_applies_and_a_bad_value_keeps_the_old_one(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    objects = client.CustomObjectsApi(api)
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=65536, gpu_number=2))
    await create_gpunode(api, "n", [40960, 24576])
    operator = start_operator()
    await create_config(api, {"policy": "firstfit"})

    async def status() -> dict[str, Any] | None:
        body = await raw_json(
            objects.get_cluster_custom_object(
                "gpushare.io", "v1alpha1", "gpushareconfigs", "default", _preload_content=False
            )
        )
        found: dict[str, Any] | None = body.get("status")
        return found

    assert (await eventually(status, what="the config status"))["accepted"] is True
    await raw_json(
        objects.patch_cluster_custom_object(
            "gpushare.io",
            "v1alpha1",
            "gpushareconfigs",
            "default",
            # Past the CRD's schema (which refuses a bad value at apply time), but above the
            # operator's backoff maximum (10 s): the operator refuses the spec whole.
            [
                {"op": "add", "path": "/spec/policy", "value": "bestfit"},
                {"op": "add", "path": "/spec/backoffInitialSeconds", "value": 20},
            ],
            _preload_content=False,
        )
    )

    async def refused() -> dict[str, Any] | None:
        found = await status()
        return found if found and found["accepted"] is False else None

    message = (await eventually(refused, what="the refusal"))["message"]
    assert "backoff initial must not exceed backoff max" in message
    assert message.endswith("; the spec accepted before (status.inForce) stays in force")
    assert (await status() or {})["inForce"] == {"policy": "firstfit"}
    # A restart (a new leader) keeps it too: the environment's bestfit does not come back.
    operator.stop()
    operator.start()
    await create_pod(core, gpu_pod("p", 20000))
    assert gpu_index(await bound(core, "p")) == "0"  # still firstfit (bestfit would take 1)


async def test_metrics_and_liveness_report_what_happened(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=11178, gpu_number=1))
    port = free_port()
    operator = start_operator(GPUSHARE_METRICS_PORT=str(port))
    await create_pod(core, gpu_pod("p", 1024))
    await create_pod(core, gpu_pod("too-big", 20000))
    await bound(core, "p")
    await unschedulable(core, "too-big")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    metrics = await asyncio.to_thread(scrape)
    assert 'gpushare_schedule_attempts_total{result="scheduled"} 1.0' in metrics
    assert 'gpushare_schedule_attempts_total{result="unschedulable"} 1.0' in metrics
    assert "gpushare_pod_scheduling_seconds_count 1.0" in metrics
    assert 'gpushare_scheduling_attempt_duration_seconds_count{result="scheduled"} 1.0' in metrics
    assert 'gpushare_pending_pods{queue="unschedulable"} 1.0' in metrics
    assert 'version="0.1.0"} 1.0' in metrics  # gpushare_build_info
    assert "gpushare_leader 1.0" in metrics
    probe = await asyncio.to_thread(operator.probe)
    assert probe is not None
    assert probe["synced"] is True
    assert probe["leading"] is True
    assert set(probe["seconds_since_event"]) >= {"pods", "nodes"}

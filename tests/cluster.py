"""Small helpers the integration tests share: pods as users write them, waiting, reading."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import pytest
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract, pod_ref
from gpushare_harness.process import LoggedProcess
from gpushare_operator.kubeapi import KubeSchedulerApi

T = TypeVar("T")


def gpu_pod(
    name: str,
    memory: int | str | None = None,
    *,
    number: int | None = None,
    scheduler: str = "volcano",
    extra_containers: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod like the guide's gpu-pod1 (one container with a GPU limit)."""
    limits: dict[str, str] = {}
    if memory is not None:
        limits[contract.GPU_MEMORY] = str(memory)
    if number is not None:
        limits[contract.GPU_NUMBER] = str(number)
    containers = [
        {
            "name": "cuda-container",
            "image": "nvidia/cuda:9.0-devel",
            "command": ["sleep"],
            "args": ["100000"],
            "resources": {"limits": limits},
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": containers + (extra_containers or []),
            **spec,
        },
    }


async def create_pod(
    core: client.CoreV1Api, body: dict[str, Any], namespace: str = "default"
) -> dict[str, Any]:
    return await raw_json(
        core.create_namespaced_pod(namespace, cast(client.V1Pod, body), _preload_content=False)
    )


async def read_pod(core: client.CoreV1Api, name: str, namespace: str = "default") -> dict[str, Any]:
    return await raw_json(core.read_namespaced_pod(name, namespace, _preload_content=False))


async def list_pods(core: client.CoreV1Api, namespace: str = "default") -> list[dict[str, Any]]:
    listed = await raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
    items: list[dict[str, Any]] = listed["items"]
    return items


async def events_of(
    core: client.CoreV1Api, name: str, namespace: str = "default"
) -> list[dict[str, Any]]:
    listed = await raw_json(
        core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 30, what: str = "the condition"
) -> T:
    """The first truthy result of `probe`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


async def reasons_once_scheduled(
    core: client.CoreV1Api, name: str, namespace: str = "default", timeout_s: float = 10
) -> list[str]:
    """The reasons of the pod's events once its Scheduled event is there: the operator posts
    it after the bind, so it may trail the bound pod a moment."""

    async def reasons() -> list[str] | None:
        found = [e["reason"] for e in await events_of(core, name, namespace)]
        return found if "Scheduled" in found else None

    return await eventually(reasons, timeout_s=timeout_s, what=f"{name}'s Scheduled event")


async def bound(
    core: client.CoreV1Api, name: str, namespace: str = "default", timeout_s: float = 30
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        pod = await read_pod(core, name, namespace)
        return pod if pod["spec"].get("nodeName") else None

    return await eventually(probe, timeout_s=timeout_s, what=f"pod {name} to be bound")


async def unschedulable(
    core: client.CoreV1Api, name: str, namespace: str = "default", timeout_s: float = 30
) -> str:
    """The PodScheduled=False message, once the scheduler has given one."""

    async def probe() -> str | None:
        pod = await read_pod(core, name, namespace)
        for condition in pod.get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return str(condition.get("message", ""))
        return None

    return await eventually(probe, timeout_s=timeout_s, what=f"pod {name} to be unschedulable")


def gpu_index(pod: dict[str, Any]) -> str | None:
    value = pod["metadata"].get("annotations", {}).get(contract.GPU_INDEX)
    return value if isinstance(value, str) else None


async def create_gpunode(
    api: client.ApiClient, name: str, cards_mib: list[int], unhealthy: tuple[int, ...] = ()
) -> None:
    """A GPUNode resource as the gpushare device plugin writes it."""
    body = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": {
            "cards": [
                {
                    "index": i,
                    "uuid": f"GPU-{name}-{i}",
                    "memoryMiB": mib,
                    "model": "test",
                    "health": "Unhealthy" if i in unhealthy else "Healthy",
                }
                for i, mib in enumerate(cards_mib)
            ]
        },
    }
    await raw_json(
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "gpushare.io", "v1alpha1", "gpunodes", body, _preload_content=False
        )
    )


async def bind_pod(
    core: client.CoreV1Api, pod: dict[str, Any], node: str, annotations: dict[str, str]
) -> None:
    """Bind `pod` as the operator does: its own Binding (protobuf, UID precondition,
    annotations with it)."""
    async with KubeSchedulerApi(
        core.api_client,  # type: ignore[attr-defined]
        identity="test",
        timeout_s=30,
    ) as api:
        await api.bind(pod_ref(pod), node, annotations)


def dev(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`gpushare-dev ARGS` as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gpushare_harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def refused_rights(processes: Sequence[LoggedProcess]) -> None:
    """Fail the test when the apiserver refused a component a right (every refusal reads
    "... is forbidden: ..."): its own identity lacks what it needs."""
    for process in processes:
        if process.log.exists() and "is forbidden" in process.log.read_text(errors="replace"):
            pytest.fail(f"{process.name} was refused a right it uses:\n{process.tail()}")

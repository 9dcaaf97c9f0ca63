"""Manifests for tests, shaped as the apiserver returns them."""

from __future__ import annotations

import itertools
from typing import Any

from gpushare.model import contract

_uids = itertools.count(1)


def gpu_pod(
    name: str,
    memory: int | str | None = None,
    *,
    number: int | None = None,
    node: str | None = None,
    index: str | None = None,
    namespace: str = "default",
    phase: str = "Pending",
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod like the guide's gpu-pod1: one container with a GPU limit."""
    limits: dict[str, Any] = {}
    if memory is not None:
        limits[contract.GPU_MEMORY] = str(memory)
    if number is not None:
        limits[contract.GPU_NUMBER] = str(number)
    annotations = {contract.GPU_INDEX: index} if index is not None else {}
    spec: dict[str, Any] = {
        "schedulerName": contract.DEFAULT_SCHEDULER_NAME,
        "containers": [
            {
                "name": "cuda-container",
                "image": "nvidia/cuda:9.0-devel",
                "resources": {"limits": limits},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{next(_uids)}",
            "annotations": annotations,
        },
        "spec": spec,
        # A pod bound with a Binding: the apiserver sets PodScheduled=True.
        "status": {"phase": phase}
        | ({"conditions": [{"type": "PodScheduled", "status": "True"}]} if node else {}),
    }


def capacity_node(
    name: str, memory: int, number: int, *, unhealthy: str | None = None
) -> dict[str, Any]:
    """A node as Volcano's device plugin leaves it: GPU totals in status.capacity."""
    annotations = {contract.GPU_UNHEALTHY_IDS: unhealthy} if unhealthy is not None else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {
            "capacity": {contract.GPU_MEMORY: str(memory), contract.GPU_NUMBER: str(number)}
        },
    }


def ready_node(name: str, memory: int, number: int) -> dict[str, Any]:
    """`capacity_node`, Ready and with room for pods, as the operator's intake reads it."""
    node = capacity_node(name, memory, number)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    node["metadata"]["resourceVersion"] = "1"
    return node


def gpunode_resource(
    name: str, card_mib: list[int], *, unhealthy: tuple[int, ...] = ()
) -> dict[str, Any]:
    """A GPUNode resource as the gpushare device plugin writes it."""
    return {
        "metadata": {"name": name},
        "spec": {
            "memoryUnitMiB": 1,
            "cards": [
                {
                    "index": i,
                    "uuid": f"GPU-{name}-{i}",
                    "model": "NVIDIA test",
                    "memoryMiB": mib,
                    "health": contract.UNHEALTHY if i in unhealthy else contract.HEALTHY,
                }
                for i, mib in enumerate(card_mib)
            ],
        },
    }

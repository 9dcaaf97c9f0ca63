"""Fake GPU nodes in a real apiserver: a Node whose status says what a kubelet with the
device plugin would say (GPU capacity, Ready), written through nodes/status as a kubelet
writes it. No kubelet runs; the control plane has no node controller to mark it NotReady."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract


@dataclass(frozen=True, kw_only=True)
class FakeGpuNode:
    name: str
    gpu_memory: int
    """`volcano.sh/gpu-memory` capacity: memory units of all cards together."""
    gpu_number: int
    """`volcano.sh/gpu-number` capacity: cards."""
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    ready: bool = True
    unschedulable: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[client.V1Taint] = field(default_factory=list)

    def capacity(self) -> dict[str, str]:
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        if self.gpu_memory or self.gpu_number:
            resources[contract.GPU_MEMORY] = str(self.gpu_memory)
            resources[contract.GPU_NUMBER] = str(self.gpu_number)
        return resources


async def create_gpu_node(api: client.CoreV1Api, node: FakeGpuNode) -> dict[str, Any]:
    """Create `node` and publish its status; returns the node as the apiserver stores it."""
    labels = {"kubernetes.io/hostname": node.name, **node.labels}
    await api.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(
                name=node.name, labels=labels, annotations=node.annotations or None
            ),
            spec=client.V1NodeSpec(
                unschedulable=node.unschedulable or None,
                taints=node.taints or None,
            ),
        )
    )
    status = {
        "status": {
            "capacity": node.capacity(),
            "allocatable": node.capacity(),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if node.ready else "False",
                    "reason": "KubeletReady" if node.ready else "KubeletNotReady",
                    "message": "fake node of the gpushare harness",
                }
            ],
            "addresses": [{"type": "Hostname", "address": node.name}],
        }
    }
    return await raw_json(api.patch_node_status(node.name, status, _preload_content=False))

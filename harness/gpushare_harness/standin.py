"""A stand-in for the device plugins of fake nodes, until the kubelet harness runs them."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client, watch

from gpushare import kube
from gpushare.model import contract
from gpushare.model.annotations import gpu_assigned


async def act_as_device_plugins(api: client.ApiClient, *, every_bound_pod: bool = False) -> None:
    """Marks bound pods `gpu-assigned` as the device plugins would once the kubelets start
    them (no kubelet runs here); without it, the exactness rule would hold back every later
    pod of the same size on a node behind the first, unassigned one. `every_bound_pod`: also
    pods placed without a card (by kube-scheduler), so that a benchmark charges each
    scheduler the same node-side write per pod."""
    core = client.CoreV1Api(api)
    marked: set[str] = set()
    limit = asyncio.Semaphore(32)  # kubelets work in parallel, one per node
    patch = {"metadata": {"annotations": {contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_TRUE}}}

    async def mark(name: str, namespace: str) -> None:
        async with limit:
            await kube.raw_json(
                core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
            )

    tasks: set[asyncio.Task[None]] = set()
    try:
        async with watch.Watch() as stream:
            async for event in stream.stream(
                core.list_pod_for_all_namespaces, _request_timeout=3600
            ):
                obj = event["raw_object"]
                uid = obj["metadata"]["uid"]
                annotations = obj["metadata"].get("annotations") or {}
                if (
                    obj["spec"].get("nodeName")
                    and (every_bound_pod or contract.GPU_INDEX in annotations)
                    and not gpu_assigned(annotations)
                    and uid not in marked
                ):
                    marked.add(uid)
                    task = asyncio.create_task(
                        mark(obj["metadata"]["name"], obj["metadata"]["namespace"])
                    )
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

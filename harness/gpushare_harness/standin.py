"""A stand-in for the device plugins of fake nodes, until the kubelet harness runs them."""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube.reflector import Item, Reflector
from gpushare.model import contract
from gpushare.model.annotations import gpu_assigned


async def act_as_device_plugins(
    api: client.ApiClient,
    *,
    every_bound_pod: bool = False,
    placement_record: bool = False,
    in_flight: int = 32,
) -> None:
    """Marks bound pods `gpu-assigned` as the device plugins would once the kubelets start
    them (no kubelet runs here); without it, the exactness rule would hold back every later
    pod of the same size on a node behind the first, unassigned one. `every_bound_pod`: also
    pods placed without a card (by kube-scheduler), so that a benchmark charges each
    scheduler the same node-side write per pod. `placement_record`: such pods get, in the
    same write, the record the operator's Binding leaves on its pods (Volcano's gpu-index and
    predicate-time), so that the pods end alike whoever placed them. `in_flight`: PATCHes at
    once (a node's kubelet each, in a real cluster). It reads pods with the project's own
    reflector (raw JSON, no model objects), so that it keeps up with any scheduler."""
    core = client.CoreV1Api(api)
    marked: set[str] = set()
    limit = asyncio.Semaphore(in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def mark(name: str, namespace: str, *, recorded: bool) -> None:
        annotations = {contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_TRUE}
        if placement_record and not recorded:
            annotations |= {contract.GPU_INDEX: "0", contract.PREDICATE_TIME: str(time.time_ns())}
        body = {"metadata": {"annotations": annotations}}
        async with limit:
            await kube.raw_json(
                core.patch_namespaced_pod(name, namespace, body, _preload_content=False)
            )

    def seen(_: str, pod: Item) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        annotations = meta.get("annotations") or {}
        if (
            (pod.get("spec") or {}).get("nodeName")
            and (every_bound_pod or contract.GPU_INDEX in annotations)
            and not gpu_assigned(annotations)
            and uid not in marked
        ):
            marked.add(uid)
            recorded = contract.GPU_INDEX in annotations
            task = asyncio.create_task(mark(meta["name"], meta["namespace"], recorded=recorded))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    pods = Reflector(
        "pods",
        core.list_pod_for_all_namespaces,
        transform=lambda pod: pod,
        on_event=seen,
        on_listed=lambda *_: None,
    )
    try:
        await pods.run()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

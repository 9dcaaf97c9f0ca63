"""Bursts: the cards the operator chooses for pods created at once, against the model placing
the same pods one by one in creation order (best-fit). A benchmark, not a test.

    python bench/burst.py [--nodes 50] [--pods 400] [--json out.json]

Two clusters, each on a fresh local control plane, the operator as its own process:
1. The demo's nodes: gpu-node-1 (8 x 11178 MiB) and gpu-node-2 (81920, 40960, 24576, 24576
   MiB), each the kubelet's device manager (`kubelet-devices`) with the device plugin at the
   default unit (512 MiB). Bursts: 40 pods of 2048 MiB (the issue's), then 40 of mixed sizes
   (512 MiB to 8 GiB). The kubelet of each node admits the pods and the plugin assigns them.
2. N fake nodes x 8 cards, each node's cards one of 11178, 24576, 40960 and 81920 MiB;
   P pods of 1, 2, 4, 8 and 10 GiB. No kubelet runs: a stand-in marks each bound pod
   `gpu-assigned` as a device plugin would.

Per burst: cards in use and memory stranded on them (free MiB on cards holding a pod), live
and in the model; the seconds from the last create to every pod bound and every pod assigned;
how many pods were ever shown `PodScheduled=False` and how many `FailedScheduling` events were
written; on the demo's nodes, how many containers got an env naming another card than their
`gpu-index` (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import contract
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.burst import BurstWatch, inventories, live_packing, model_packing
from gpushare_harness.crds import install_crds
from gpushare_harness.devicenode import DeviceNode, start_device_node
from gpushare_harness.identities import install_roles
from gpushare_harness.kubelet import KubeletHarness
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

UNIT = contract.DEFAULT_MEMORY_UNIT_MIB
DEMO_NODES = (("gpu-node-1", "8x11178"), ("gpu-node-2", "1x81920,1x40960,2x24576"))
CARD_SIZES_MIB = (11178, 24576, 40960, 81920)
POD_SIZES_MIB = (1024, 2048, 4096, 8192, 10240)


def pod(name: str, amount: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {contract.GPU_MEMORY: str(amount)}},
                }
            ],
        },
    }


async def burst(
    api: client.ApiClient,
    namespace: str,
    amounts: list[int],
    kubelets: list[KubeletHarness],
) -> dict[str, Any]:
    """Creates one pod per amount (32 creates in flight) and waits until all are assigned."""
    core = client.CoreV1Api(api)
    seen = BurstWatch(namespace, len(amounts))
    ready = asyncio.Event()
    watcher = asyncio.create_task(seen.run(api, ready))
    await ready.wait()
    names = [f"p-{i:04d}" for i in range(len(amounts))]
    limit = asyncio.Semaphore(32)

    async def create(name: str, amount: int) -> None:
        async with limit:
            await kube.raw_json(
                core.create_namespaced_pod(
                    namespace, cast(client.V1Pod, pod(name, amount)), _preload_content=False
                )
            )

    await asyncio.gather(*(create(n, a) for n, a in zip(names, amounts, strict=True)))
    last_create = time.monotonic()
    try:
        await asyncio.wait_for(seen.all_assigned.wait(), timeout=300)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    listed = await kube.raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
    pods = listed["items"]
    cluster = await inventories(api)
    live = live_packing(cluster, pods)
    model = model_packing(cluster, seen.ordered(pods))
    events = await kube.raw_json(
        core.list_namespaced_event(
            namespace, field_selector="reason=FailedScheduling", _preload_content=False
        )
    )
    result: dict[str, Any] = {
        "pods": len(names),
        "cards_used": {"live": live.cards_used, "model": model.cards_used},
        "stranded_mib": {"live": live.stranded_mib, "model": model.stranded_mib},
        "unplaced": {"live": live.unplaced, "model": model.unplaced},
        "same_cards_as_model": live.used == model.used,
        "all_bound_s": round(max(seen.bound.values()) - last_create, 2),
        "all_assigned_s": round(max(seen.assigned.values()) - last_create, 2),
        "shown_unschedulable": len(seen.reported),
        "failed_scheduling_events": len(events["items"]),
    }
    if kubelets:
        started = {
            line["pod"]: line["envs"]
            for kubelet in kubelets
            for line in kubelet.log_events()
            if line.get("event") == "started"
        }
        result["env_not_annotation"] = sum(
            1
            for p in pods
            if started.get(f"{namespace}/{p['metadata']['name']}", {}).get(
                contract.ENV_VISIBLE_DEVICES
            )
            != p["metadata"]["annotations"].get(contract.GPU_INDEX)
        )
    return result


async def demo_nodes(workdir: Path) -> dict[str, Any]:
    plane = ControlPlane(workdir / "demo").start()
    nodes: list[DeviceNode] = []
    operator = OperatorProcess(
        plane.kubeconfig, workdir / "demo-operator.log", env={"GPUSHARE_LEADER_ELECT": "false"}
    )
    try:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await install_crds(api)
            await install_roles(plane.binaries.kubectl, plane.kubeconfig)
            for name, cards in DEMO_NODES:
                nodes.append(await start_device_node(core, plane.kubeconfig, name, cards, workdir))
            kubelets = [node.kubelet for node in nodes]
            operator.start()
            rng = random.Random(11)
            mixed = [rng.choice((512, 1024, 2048, 4096, 8192)) // UNIT for _ in range(40)]
            results = {}
            for label, namespace, amounts in (
                ("40 x 2048 MiB", "same", [2048 // UNIT] * 40),
                ("40 mixed", "mixed", mixed),
            ):
                await core.create_namespace(
                    cast(client.V1Namespace, {"metadata": {"name": namespace}})
                )
                results[label] = await burst(api, namespace, amounts, kubelets)
                await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
                await wait_empty(core, namespace)
            return results
    finally:
        operator.stop()
        for node in nodes:
            node.stop()
        plane.stop()


async def wait_empty(core: client.CoreV1Api, namespace: str) -> None:
    for _ in range(600):
        listed = await kube.raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
        if not listed["items"]:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"pods of namespace {namespace} still there after 60 s")


async def many_nodes(workdir: Path, nodes: int, pods: int) -> dict[str, Any]:
    plane = ControlPlane(workdir / "many").start()
    try:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await install_crds(api)
            await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": "many"}}))
            rng = random.Random(5)
            for number in range(nodes):
                card = rng.choice(CARD_SIZES_MIB)
                await create_gpu_node(
                    core, FakeGpuNode(name=f"node-{number:03d}", gpu_memory=8 * card, gpu_number=8)
                )
            assigner = asyncio.create_task(act_as_device_plugins(api))
            operator = OperatorProcess(
                plane.kubeconfig,
                workdir / "many-operator.log",
                env={"GPUSHARE_LEADER_ELECT": "false"},
            ).start()
            try:
                amounts = [rng.choice(POD_SIZES_MIB) for _ in range(pods)]
                return await burst(api, "many", amounts, [])
            finally:
                operator.stop()
                assigner.cancel()
                await asyncio.gather(assigner, return_exceptions=True)
    finally:
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {platform.python_version()}, 2 cores shared by all"
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as workdir:
        for label, value in asyncio.run(demo_nodes(Path(workdir))).items():
            results[f"demo nodes, {label}"] = value
        many = asyncio.run(many_nodes(Path(workdir), args.nodes, args.pods))
        results[f"{args.nodes} nodes x 8 mixed cards, {args.pods} mixed pods"] = many
    for label, figures in results.items():
        print(label)
        for key, value in figures.items():
            print(f"  {key:<26} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "args": vars(args), "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Operator start-up at scale: resident memory and the time to rebuild its state from a large
cluster held by the real apiserver. A benchmark, not a test.

    python bench/scale.py [--nodes 5000] [--pods 50000] [--json out.json]

N fake nodes x 8 cards (80 GiB) and P pods are created in a fresh local control plane; the
pods are created already bound (spec.nodeName, `gpu-index`, `gpu-assigned`), as the cluster
looks after a restart. Then the operator starts: the figure is the time from its process
start to its `synced` log line (one LIST of nodes, GPUNodes and pods; the ledger, the node
facts and the exactness pins rebuilt), and its resident memory then (VmRSS) and at its peak
(VmHWM), read from /proc. Targets: <= 30 s and <= 400 MiB for 5,000 nodes and 50,000 pods.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import contract
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_crds
from gpushare_harness.operator import OperatorProcess

CARD_MIB = 81920
CARDS = 8


def memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


async def populate(core: client.CoreV1Api, nodes: int, pods: int) -> float:
    """Nodes, then pods bound to them; the seconds it took."""
    started = time.monotonic()
    limit = asyncio.Semaphore(48)

    async def node(number: int) -> None:
        async with limit:
            await create_gpu_node(
                core,
                FakeGpuNode(
                    name=f"node-{number:05d}", gpu_memory=CARDS * CARD_MIB, gpu_number=CARDS
                ),
            )

    await asyncio.gather(*(node(n) for n in range(nodes)))

    async def pod(number: int) -> None:
        slot = number % (nodes * CARDS)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"p-{number:06d}",
                "annotations": {
                    contract.GPU_INDEX: str(slot % CARDS),
                    contract.PREDICATE_TIME: str(time.time_ns()),
                    contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_TRUE,
                },
            },
            "spec": {
                "schedulerName": "volcano",
                "nodeName": f"node-{slot // CARDS:05d}",
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {
                            "limits": {contract.GPU_MEMORY: "2048", "cpu": "100m"},
                        },
                    }
                ],
            },
        }
        async with limit:
            await kube.raw_json(
                core.create_namespaced_pod(
                    "default", cast(client.V1Pod, body), _preload_content=False
                )
            )

    for first in range(0, pods, 5000):  # in slices, so the gather stays small
        await asyncio.gather(*(pod(n) for n in range(first, min(pods, first + 5000))))
    return time.monotonic() - started


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with ControlPlane(workdir / "plane") as plane:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await install_crds(api)
            await core.create_namespace(
                cast(client.V1Namespace, {"metadata": {"name": "gpushare-system"}})
            )
            populate_s = await populate(core, args.nodes, args.pods)
            print(f"created {args.nodes} nodes and {args.pods} pods in {populate_s:.0f} s")
        operator = OperatorProcess(
            plane.kubeconfig, workdir / "operator.log", env={"GPUSHARE_LEADER_ELECT": "false"}
        )
        started = time.monotonic()
        operator.start(wait_synced=False)
        synced_line = await asyncio.to_thread(operator.wait_logged, "synced", timeout_s=600)
        startup_s = time.monotonic() - started
        await asyncio.sleep(2)  # the first GPUNode status round and metrics settle
        memory = memory_mib(operator.pid)
        operator.stop()
    return {
        "nodes": args.nodes,
        "cards": args.nodes * CARDS,
        "pods": args.pods,
        "populate_s": round(populate_s, 1),
        "startup_to_synced_s": round(startup_s, 2),
        "synced_log": {k: v for k, v in synced_line.items() if k not in ("timestamp", "level")},
        "rss_mib": memory.get("VmRSS"),
        "peak_rss_mib": memory.get("VmHWM"),
        "targets": {"startup_to_synced_s": 30, "rss_mib": 400},
    }


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    print(f"operator start-up, {args.nodes} nodes x {CARDS} cards, {args.pods} pods; {machine()}")
    for key, value in results.items():
        print(f"  {key:<22} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

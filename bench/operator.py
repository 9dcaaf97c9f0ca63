"""Operator throughput and create-to-bound latency on the real local control plane.

A benchmark, not a test: it prints a table and writes JSON; nothing asserts on time.

    python bench/operator.py [--nodes 200] [--cards 8] [--pods 2000]

In one run, on one fresh control plane with N fake nodes x 8 cards (11178 MiB):
1. raw: the rate at which a minimal client binds pre-created pods with the same Binding
   (annotations and UID precondition), 32 in flight: the limit of this machine's apiserver;
2. backlog: the operator starts with P pods pending and binds them all; pods bound per second
   from its sync to the last bind, as seen by a watch;
Bound pods are marked `gpu-assigned` as the device plugins would mark them (the same API load).
3. stream: with the operator running, P new pods are created as fast as a client can (16 in
   flight); create-to-bound latency per pod (client's create answer to the watch's bind),
   p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client, watch

from gpushare import kube
from gpushare.model import contract
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_crds
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

CARD_MIB = 11178


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {contract.GPU_MEMORY: "1024"}},
                }
            ],
        },
    }


async def create_pods(
    core: client.CoreV1Api,
    namespace: str,
    names: list[str],
    *,
    scheduler: str,
    in_flight: int,
    created: dict[str, float] | None = None,
) -> list[str]:
    """Creates the pods; returns their uids (and records when each create was answered)."""
    limit = asyncio.Semaphore(in_flight)
    uids: list[str] = []

    async def one(name: str) -> None:
        async with limit:
            body = await kube.raw_json(
                core.create_namespaced_pod(
                    namespace, cast(client.V1Pod, pod(name, scheduler)), _preload_content=False
                )
            )
            if created is not None:
                created[name] = time.monotonic()
            uids.append(body["metadata"]["uid"])

    await asyncio.gather(*(one(name) for name in names))
    return uids


async def raw_bind_rate(core: client.CoreV1Api, namespace: str, count: int, nodes: int) -> float:
    names = [f"raw-{i}" for i in range(count)]
    await create_pods(core, namespace, names, scheduler="nobody", in_flight=32)
    listed = await kube.raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in listed["items"]}
    limit = asyncio.Semaphore(32)

    async def bind(number: int, name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "uid": uid[name],
                "annotations": {
                    contract.GPU_INDEX: str(number % 8),
                    contract.PREDICATE_TIME: str(time.time_ns()),
                },
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": f"node-{number % nodes:04d}"},
        }
        async with limit:
            await kube.raw_json(
                core.create_namespaced_pod_binding(
                    name, namespace, cast(client.V1Binding, body), _preload_content=False
                )
            )

    started = time.monotonic()
    await asyncio.gather(*(bind(i, name) for i, name in enumerate(names)))
    return count / (time.monotonic() - started)


async def watch_binds(
    api: client.ApiClient,
    namespace: str,
    bound: dict[str, float],
    expected: int,
    done: asyncio.Event,
) -> None:
    """Records when the watch first shows each pod with a node."""
    core = client.CoreV1Api(api)
    async with watch.Watch() as stream:
        async for event in stream.stream(core.list_namespaced_pod, namespace, _request_timeout=600):
            obj = event["raw_object"]
            name = obj["metadata"]["name"]
            if obj["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) >= expected:
                    done.set()
                    return


async def create_nodes(core: client.CoreV1Api, nodes: int, cards: int) -> None:
    limit = asyncio.Semaphore(16)

    async def node(number: int) -> None:
        async with limit:
            await create_gpu_node(
                core,
                FakeGpuNode(
                    name=f"node-{number:04d}", gpu_memory=cards * CARD_MIB, gpu_number=cards
                ),
            )

    await asyncio.gather(*(node(n) for n in range(nodes)))


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plane = ControlPlane(workdir / "plane").start()
    try:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await install_crds(api)
            for namespace in ("gpushare-system", "raw", "backlog", "stream"):
                await core.create_namespace(
                    cast(client.V1Namespace, {"metadata": {"name": namespace}})
                )
            await create_nodes(core, args.nodes, args.cards)
            plugins = asyncio.create_task(act_as_device_plugins(api))
            raw = await raw_bind_rate(core, "raw", args.pods, args.nodes)
            print(f"raw Binding rate: {raw:.0f}/s", flush=True)

            backlog_names = [f"b-{i}" for i in range(args.pods)]
            await create_pods(core, "backlog", backlog_names, scheduler="volcano", in_flight=32)
            operator = OperatorProcess(
                plane.kubeconfig,
                workdir / "operator.log",
                env={"GPUSHARE_LEADER_ELECT": "false"},
                profile=Path(args.profile) if args.profile else None,
            )
            bound: dict[str, float] = {}
            done = asyncio.Event()
            watcher = asyncio.create_task(watch_binds(api, "backlog", bound, args.pods, done))
            await asyncio.sleep(0.5)
            operator.start(wait_synced=False)
            await asyncio.to_thread(operator.wait_logged, "synced", timeout_s=120)
            synced = time.monotonic()
            pids = {**plane.pids(), "operator": operator.pid, "bench": os.getpid()}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            await asyncio.wait_for(done.wait(), timeout=600)
            cpu = {
                name: round(cpu_seconds(pid) - cpu_before[name], 1) for name, pid in pids.items()
            }
            print(f"backlog CPU seconds by process: {cpu}", flush=True)
            backlog_rate = args.pods / (max(bound.values()) - synced)
            print(f"backlog: {backlog_rate:.0f} pods bound/s", flush=True)
            await watcher

            created: dict[str, float] = {}
            bound_stream: dict[str, float] = {}
            done_stream = asyncio.Event()
            watcher = asyncio.create_task(
                watch_binds(api, "stream", bound_stream, args.pods, done_stream)
            )
            await asyncio.sleep(0.5)
            names = [f"s-{i}" for i in range(args.pods)]
            started = time.monotonic()
            await create_pods(
                core, "stream", names, scheduler="volcano", in_flight=16, created=created
            )
            await asyncio.wait_for(done_stream.wait(), timeout=600)
            await watcher
            stream_rate = args.pods / (max(bound_stream.values()) - started)
            latencies = sorted(bound_stream[n] - created[n] for n in names)
            operator.stop()
            plugins.cancel()
            await asyncio.gather(plugins, return_exceptions=True)
    finally:
        plane.stop()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return {
        "raw_bind_per_s": round(raw),
        "backlog_bound_per_s": round(backlog_rate),
        "backlog_vs_raw": round(backlog_rate / raw, 2),
        "stream_bound_per_s": round(stream_rate),
        "create_to_bound_p50_ms": round(statistics.median(latencies) * 1000),
        "create_to_bound_p99_ms": round(p99 * 1000),
        "backlog_cpu_s": cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--profile", help="write a cProfile of the operator here")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {platform.python_version()}, 2 cores shared by all"
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    print(f"{args.nodes} nodes x {args.cards} cards, {args.pods} pods; {machine}")
    for key, value in results.items():
        print(f"  {key:<26} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "args": vars(args), "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

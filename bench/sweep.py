"""The operator's sweeps over every GPU node, timed: the GPUNode status writer and the over-use
check look at each node every status interval (2 s) on the event loop the binds run on.
A benchmark, not a test: it prints a table and writes JSON; nothing asserts on time.

    python bench/sweep.py [--nodes 5000] [--cards 8] [--pods 40000] [--sweeps 5] [--json out.json]

The scheduler's cache is built as the operator builds it (nodes, their GPUNode resources, and
bound pods, one per card share), every status written once; then each sweep runs over nodes
that did not change, as most do between two intervals, and, the worst case, over nodes whose
GPUNode was each seen again (as a device plugin's heartbeat, every 30 s, brings it), while a
task that stands for the binds counts its turns of the event loop. The over-use check judges
nodes with no measurement (the fake backend's). Figures: each sweep's time, and the longest
the event loop was held in it (the most a bind waits for a sweep).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from gpushare.model import contract
from gpushare_harness import FakeGpuNode
from gpushare_harness.benchargs import positive
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.overuse import OverUseGuard
from gpushare_operator.reporting import Reporter
from gpushare_operator.runtime import release_memory
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.status import StatusWriter

CARD_MIB = 81920
CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), status_write_rate=1_000_000)


class StatusSink:
    """Where the status writer's writes go: nowhere (the first sweep writes every node)."""

    async def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> None:
        return None


def cluster(nodes: int, cards: int, pods: int) -> SchedulerCache:
    cache = SchedulerCache(config=lambda: CONFIG)
    for number in range(nodes):
        name = f"node-{number:04d}"
        capacity = FakeGpuNode(name=name, gpu_memory=cards * CARD_MIB, gpu_number=cards).capacity()
        cache.observe_node(
            {
                "metadata": {"name": name},
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
        cache.observe_gpunode(
            {
                "metadata": {"name": name},
                "spec": {
                    "memoryUnitMiB": 1,
                    "cards": [
                        {
                            "index": index,
                            "uuid": f"GPU-{name}-{index}",
                            "model": "NVIDIA bench",
                            "memoryMiB": CARD_MIB,
                            "health": contract.HEALTHY,
                        }
                        for index in range(cards)
                    ],
                },
            }
        )
    for number in range(pods):
        card, node = divmod(number, nodes)
        cache.observe_pod(PodInfo.parse(bound_pod(f"pod-{number}", node, card % cards)))
    return cache


def bound_pod(name: str, node: int, card: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "annotations": {contract.GPU_INDEX: str(card), contract.GPU_ASSIGNED: "true"},
        },
        "spec": {
            "nodeName": f"node-{node:04d}",
            "schedulerName": "volcano",
            "containers": [
                {"name": "main", "resources": {"limits": {contract.GPU_MEMORY: "4096"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


async def timed(
    sweep: Callable[[], Awaitable[None]], sweeps: int, before: Callable[[], None] = lambda: None
) -> dict[str, float]:
    """Each sweep's time and the longest the event loop was held in any (ms, the worst);
    `before` each sweep, untimed."""
    held = 0.0
    last = time.perf_counter()

    async def binds() -> None:  # stands for the binds: how long between its turns
        nonlocal held, last
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            held, last = max(held, now - last), now

    ticking = asyncio.create_task(binds())
    times, holds = [], []
    for _ in range(sweeps):
        before()
        await asyncio.sleep(0)
        held, last = 0.0, time.perf_counter()
        started = time.perf_counter()
        await sweep()
        times.append(time.perf_counter() - started)
        await asyncio.sleep(0)  # the binds' turn after the sweep counts its last hold
        holds.append(held)
    ticking.cancel()
    return {
        "sweep_ms": round(max(times) * 1000, 2),
        "loop_held_ms": round(max(holds) * 1000, 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cache = cluster(args.nodes, args.cards, args.pods)
    writer = StatusWriter(
        cache=cache,
        gangs=GangBook(),
        api=cast(SchedulerApi, StatusSink()),
        metrics=SchedulerMetrics(),
        config=lambda: CONFIG,
    )
    await writer.write_changed()  # every status written once: the next sweeps find no change
    release_memory()  # and the heap frozen, as the operator's once it has listed
    guard = OverUseGuard(
        cache=cache,
        api=cast(SchedulerApi, StatusSink()),
        reporter=cast(Reporter, None),  # no measurement, so nothing to report
        metrics=SchedulerMetrics(),
        config=lambda: CONFIG,
        fence=cast(WriteFence, None),
    )

    def heartbeats() -> None:  # every GPUNode seen again, as each plugin's heartbeat brings it
        for name in cache.gpunode_names():
            cache.observe_gpunode(dict(cache.gpunode(name) or {}))

    return {
        "status writer": await timed(writer.write_changed, args.sweeps),
        "status writer, every GPUNode seen again": await timed(
            writer.write_changed, args.sweeps, heartbeats
        ),
        "over-use check": await timed(guard.check, args.sweeps),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=positive, default=5000)
    parser.add_argument("--cards", type=positive, default=8)
    parser.add_argument("--pods", type=positive, default=40000)
    parser.add_argument("--sweeps", type=positive, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"{args.nodes} nodes x {args.cards} cards, {args.pods} pods, worst of {args.sweeps}:")
    print(f"{'sweep':<40} {'time (ms)':>10} {'loop held (ms)':>15}")
    for name, figures in results.items():
        print(f"{name:<40} {figures['sweep_ms']:>10} {figures['loop_held_ms']:>15}")
    if args.json:
        machine = f"{platform.machine()}, {platform.python_version()}"
        with open(args.json, "w") as out:
            json.dump({"machine": machine, "args": vars(args), "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

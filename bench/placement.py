"""Placement decisions per second on one core: 5,000 nodes x 8 cards holding 40,000 pods.

A benchmark, not a test: it prints a table and writes JSON; nothing asserts on time.

    python bench/placement.py [--nodes 5000] [--cards 8] [--pods 40000] [--decisions 20000]

The cluster is built the way the operator builds it: nodes from their manifests, pods from
their `volcano.sh/gpu-index` annotations (claim_of). Then, for each policy, a steady stream of
decisions: place a pod (with a node check standing in for the other filters), record it as
the scheduler's assume step does, and release a random earlier pod so the occupancy stays
put. Figures are decisions per second of place() + assume, measured in the same run for all
policies; rebuild time is the cost of reading 40,000 pod manifests at start-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from typing import Any

from gpushare.model import (
    GpuKind,
    Ledger,
    NodeName,
    Placement,
    PodRef,
    PodRequest,
    PodUid,
    Policy,
    claim_of,
    contract,
    node_inventory,
    place,
)

CARD_MIB = 81920
SIZES_GIB = (1, 2, 4, 8, 10, 20, 40)


def node_manifest(name: str, cards: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "capacity": {
                contract.GPU_MEMORY: str(cards * CARD_MIB),
                contract.GPU_NUMBER: str(cards),
            }
        },
    }


def pod_manifest(number: int, node: str, card: int, mib: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pod-{number}",
            "namespace": "bench",
            "uid": f"uid-{number}",
            "annotations": {contract.GPU_INDEX: str(card)},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {contract.GPU_MEMORY: str(mib)}}}],
        },
        "status": {"phase": "Running"},
    }


def build(nodes: int, cards: int, pods: int, seed: int) -> tuple[Ledger, list[PodUid], float]:
    rng = random.Random(seed)
    manifests = []
    # Pods spread evenly, each card filled to a random level below its size.
    for number in range(pods):
        node, card = divmod(number % (nodes * cards), cards)
        manifests.append(
            pod_manifest(number, f"node-{node:05d}", card, rng.choice(SIZES_GIB[:4]) * 1024)
        )
    started = time.perf_counter()
    ledger = Ledger()
    for index in range(nodes):
        inventory = node_inventory(node_manifest(f"node-{index:05d}", cards))
        assert inventory is not None
        ledger.set_node(inventory)
    uids = []
    for manifest in manifests:
        claim = claim_of(manifest)
        assert claim.allocation is not None
        ledger.add(claim.allocation)
        uids.append(claim.allocation.pod.uid)
    return ledger, uids, time.perf_counter() - started


def run(policy: Policy, args: argparse.Namespace) -> dict[str, Any]:
    ledger, live, rebuild_s = build(args.nodes, args.cards, args.pods, args.seed)
    rng = random.Random(args.seed + 1)
    requests = [
        PodRequest(kind=GpuKind.MEMORY, total=rng.choice(SIZES_GIB) * 1024, containers=())
        for _ in range(args.decisions)
    ]
    cordoned = {NodeName(f"node-{i:05d}") for i in range(0, args.nodes, 50)}

    def node_check(node: NodeName) -> str | None:
        return "node is cordoned" if node in cordoned else None

    placed = unplaceable = 0
    elapsed = 0.0
    for number, request in enumerate(requests):
        started = time.perf_counter()
        result = place(ledger, request, policy, node_check=node_check)
        if isinstance(result, Placement):
            uid = PodUid(f"new-{number}")
            ledger.add(result.allocation(PodRef(namespace="bench", name=uid, uid=uid)))
            placed += 1
        else:
            unplaceable += 1
        elapsed += time.perf_counter() - started
        if isinstance(result, Placement):
            live.append(uid)
        # Churn outside the timed section: a random pod finishes.
        victim = rng.randrange(len(live))
        live[victim], live[-1] = live[-1], live[victim]
        ledger.release(live.pop())
    return {
        "policy": policy.value,
        "decisions": args.decisions,
        "placed": placed,
        "unplaceable": unplaceable,
        "decisions_per_s": round(args.decisions / elapsed),
        "mean_us": round(elapsed / args.decisions * 1e6, 1),
        "rebuild_s": round(rebuild_s, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default=",".join(p.value for p in Policy))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    print(
        f"{args.nodes} nodes x {args.cards} cards, {args.pods} pods, "
        f"{args.decisions} decisions per policy; {machine}; one core"
    )
    results = [run(Policy(name), args) for name in args.policies.split(",")]
    print(
        f"{'policy':<9} {'decisions/s':>11} {'mean µs':>8} {'placed':>7} {'unplaceable':>11} "
        f"{'rebuild s':>9}"
    )
    for r in results:
        print(
            f"{r['policy']:<9} {r['decisions_per_s']:>11} {r['mean_us']:>8} {r['placed']:>7} "
            f"{r['unplaceable']:>11} {r['rebuild_s']:>9}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine, "args": vars(args), "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Packing quality: GPU memory in use when the first pod no longer fits, per policy, against
a proven upper bound for the same arrival sequence. A benchmark, not a test.

    python bench/packing.py [--nodes 50] [--cards 8] [--seeds 5] [--json out.json]

Each workload is a seeded stream of gpu-memory pods placed one by one, as the operator
places them (the model's `find_placement` on a `Ledger`), until the first pod that fits on no
card. The figure is the memory in use at that moment, as a share of the cluster.

Four workloads: the mix 1, 2, 4, 8, 10, 20, 40 GiB on 80 GiB cards and the guide's 11178 MiB
cards (512 MiB to 4 GiB pods), each once filling up and once with pods finishing (seeded
exponential lifetimes, offering 1.3 times the cluster at steady state), which fragments free
memory before the cluster fills: where the policies differ.

The bound: no placement, even one that knows the whole sequence in advance, can keep running
a set of pods that needs more cards than the cluster has. Martello and Toth's L2 lower bound
on the cards a set of pods needs (1990) is computed for the running pods at each arrival
(with each card's usable size: the largest multiple of the sizes' gcd); at the first arrival
where it exceeds the cluster every placement has failed, so none can fail with more memory in
use than the most in use before that arrival. L2 is a bound, not the optimum: the real gap to
the optimum is at most the one shown.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.model import (
    GpuKind,
    Ledger,
    PodRef,
    PodRequest,
    PodUid,
    Policy,
    contract,
    node_inventory,
)
from gpushare.model.placement import find_placement

GIB = 1024


MIXED_GIB = (1, 2, 4, 8, 10, 20, 40)


@dataclass(frozen=True)
class Workload:
    name: str
    card_mib: int
    sizes_mib: tuple[int, ...]
    churn: bool = False
    """Pods also finish (seeded lifetimes), so free memory fragments before the cluster
    fills: where the policies differ."""


WORKLOADS = (
    Workload("mixed on 80 GiB cards", 81920, tuple(g * GIB for g in MIXED_GIB)),
    Workload("mixed, pods finishing", 81920, tuple(g * GIB for g in MIXED_GIB), churn=True),
    Workload("the guide's 11178 MiB cards", 11178, (512, 1024, 2048, 3072, 4096)),
    Workload("the guide's, pods finishing", 11178, (512, 1024, 2048, 3072, 4096), churn=True),
)


@dataclass(frozen=True)
class Arrival:
    size: int
    leaves_at: int
    """The arrival number before which this pod has finished (never, without churn)."""


def sequence(workload: Workload, cards: int, seed: int) -> list[Arrival]:
    """Enough pods to overflow the cluster, in a seeded random order. With churn, lifetimes
    are exponential with a mean that offers 1.3 times the cluster's memory at steady state."""
    rng = random.Random(seed)
    mean = statistics.mean(workload.sizes_mib)
    fill = cards * workload.card_mib / mean
    count = int(fill * (6 if workload.churn else 1.5)) + 10
    arrivals = []
    for number in range(count):
        life = 1 + int(rng.expovariate(1 / (1.3 * fill))) if workload.churn else count + 1
        arrivals.append(Arrival(size=rng.choice(workload.sizes_mib), leaves_at=number + life))
    return arrivals


def usable(capacity: int, sizes: tuple[int, ...]) -> int:
    """What a card can hold: when every size is a multiple of g, a card holds at most the
    largest multiple of g within its capacity (11178 MiB cards hold at most 10752 MiB of
    pods asking for multiples of 512)."""
    step = math.gcd(*sizes)
    return capacity // step * step


def placed_until_first_failure(
    policy: Policy, workload: Workload, nodes: int, cards: int, arrivals: list[Arrival]
) -> int:
    """Memory in use (MiB) when the first pod fits nowhere."""
    ledger = Ledger()
    for index in range(nodes):
        node = {
            "metadata": {"name": f"node-{index:04d}"},
            "status": {
                "capacity": {
                    contract.GPU_MEMORY: str(cards * workload.card_mib),
                    contract.GPU_NUMBER: str(cards),
                }
            },
        }
        inventory = node_inventory(node)
        assert inventory is not None
        ledger.set_node(inventory)
    used = 0
    running: list[tuple[int, PodUid, int]] = []  # (leaves_at, uid, size), a heap
    for number, arrival in enumerate(arrivals):
        while running and running[0][0] <= number:
            _, gone, size = heapq.heappop(running)
            ledger.release(gone)
            used -= size
        request = PodRequest(kind=GpuKind.MEMORY, total=arrival.size, containers=())
        found = find_placement(ledger, request, policy)
        if found is None:
            return used
        uid = PodUid(f"p{number}")
        ledger.add(found.allocation(PodRef(namespace="bench", name=uid, uid=uid)))
        heapq.heappush(running, (arrival.leaves_at, uid, arrival.size))
        used += arrival.size
    return used


def l2_bound(sizes: Counter[int], capacity: int) -> int:
    """Martello-Toth L2: a lower bound on the cards these pods need."""
    best = 0
    half = capacity / 2
    for alpha in [0, *(s for s in sizes if s <= half)]:
        big = sum(n for s, n in sizes.items() if s > capacity - alpha)
        middle = [(s, n) for s, n in sizes.items() if half < s <= capacity - alpha]
        small = sum(s * n for s, n in sizes.items() if alpha <= s <= half)
        room = sum(n for _, n in middle) * capacity - sum(s * n for s, n in middle)
        extra = max(0, math.ceil((small - room) / capacity))
        best = max(best, big + sum(n for _, n in middle) + extra)
    return best


def bound_until_first_failure(arrivals: list[Arrival], bins: int, capacity: int) -> int:
    """An upper bound on the memory in use at the first failure of any placement: the pods
    running together, the new one included, must fit by L2 until some arrival; no placement
    survives past it, so none can fail with more memory in use than the most in use before it."""
    sizes: Counter[int] = Counter()
    running: list[tuple[int, int]] = []
    used = most = 0
    for number, arrival in enumerate(arrivals):
        while running and running[0][0] <= number:
            _, size = heapq.heappop(running)
            sizes[size] -= 1
            used -= size
        most = max(most, used)
        sizes[arrival.size] += 1
        if l2_bound(+sizes, capacity) > bins:
            return most
        heapq.heappush(running, (arrival.leaves_at, arrival.size))
        used += arrival.size
    return max(most, used)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    bins = args.nodes * args.cards
    for workload in WORKLOADS:
        total = bins * workload.card_mib
        shares: dict[str, list[float]] = {p.value: [] for p in Policy}
        shares["bound"] = []
        for seed in range(args.seeds):
            pods = sequence(workload, bins, seed)
            capacity = usable(workload.card_mib, workload.sizes_mib)
            shares["bound"].append(bound_until_first_failure(pods, bins, capacity) / total)
            for policy in Policy:
                used = placed_until_first_failure(policy, workload, args.nodes, args.cards, pods)
                shares[policy.value].append(used / total)
        bound = statistics.mean(shares["bound"])
        for name, values in shares.items():
            rows.append(
                {
                    "workload": workload.name,
                    "policy": name,
                    "mean_in_use": round(statistics.mean(values), 4),
                    "min_in_use": round(min(values), 4),
                    "of_bound": round(statistics.mean(values) / bound, 4),
                    "worst_of_bound": round(
                        min(v / b for v, b in zip(values, shares["bound"], strict=True)), 4
                    ),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rows = run(args)
    print(f"{args.nodes} nodes x {args.cards} cards, {args.seeds} seeded sequences per workload")
    print(
        f"  {'workload':<30} {'policy':<9} {'in use':>7} {'worst':>7} {'of bound':>9} {'worst':>7}"
    )
    for row in rows:
        print(
            f"  {row['workload']:<30} {row['policy']:<9} {row['mean_in_use']:>7.1%} "
            f"{row['min_in_use']:>7.1%} {row['of_bound']:>9.1%} {row['worst_of_bound']:>7.1%}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

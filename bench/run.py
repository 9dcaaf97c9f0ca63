"""Every benchmark, one command: a JSON report, PNG plots, and each result as a table.

    python bench/run.py [--quick] [--out bench-results]

Full run (about 30 minutes on 2 cores): placement decisions/s (5,000 nodes x 8 cards);
packing quality against the L2 bound; the operator against kube-scheduler (its client limit
raised, and at its default) and the raw Binding rate, on one apiserver per size, at 200,
1,000 and 5,000 fake nodes x 8 cards, each scheduler on its own identity;
what each write in which the two schedulers differ costs the apiserver and etcd; what the
placement policy costs a status write of a GPU pod and of a pod without GPUs;
bursts of pods created at once, packed live against the model placing them one by one;
gangs of 8 pods (Volcano PodGroups) against single pods, bound per second, on 200 nodes;
operator start-up rebuild time and memory with 5,000 nodes and 50,000 pods; the operator's
sweeps over every node (status, over-use) and how long they hold its event loop; device-plugin
Allocate latency with 500 pods on the node and the ListAndWatch message for 8 x 141 GiB; on
real nodes (the kubelet, containerd, runc; root), the pod's size per device id, the largest
pod that runs at 1 MiB per device, admission after a kubelet restart with 100 GPU pods, and
40-pod bursts with and without GPUs (5 runs each).
`--quick` runs each at a small size (a minute or two; the real node is left out): CI runs it
as a smoke test.

Each benchmark is its own script (bench/*.py, runnable alone) and its own process; this
runner collects their JSON into `report.json`, with the machine it ran on, and draws
`packing.png`, `operator.png` and `plugin.png`. With `--only`, the chosen benchmarks' results
replace theirs in an existing report of the same machine in `--out`, and the plots are drawn
again once the report holds every benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent

FULL: dict[str, list[list[str]]] = {
    "placement": [["--decisions", "10000"]],
    "packing": [["--nodes", "50", "--seeds", "5"]],
    "operator": [
        *(["--nodes", str(n), "--pods", "2000"] for n in (200, 1000)),
        ["--nodes", "5000", "--pods", "2000", "--rounds", "1"],
    ],
    "scale": [["--nodes", "5000", "--pods", "50000"]],
    "plugin": [["--pods", "500"]],
    "server_cost": [["--writes", "3000", "--rounds", "5"]],
    "admission_cost": [["--writes", "2000", "--rounds", "3"]],
    "burst": [["--nodes", "50", "--pods", "400"]],
    "gangs": [["--gang-size", "8", "--nodes", "200", "--pods", "1600"]],
    "sweep": [["--nodes", "5000", "--pods", "40000"]],
    "realnode": [["--pods", "100"]],
}
QUICK: dict[str, list[list[str]]] = {
    "placement": [["--nodes", "200", "--pods", "1600", "--decisions", "2000"]],
    "packing": [["--nodes", "10", "--seeds", "2"]],
    "operator": [["--nodes", "20", "--pods", "100", "--single", "10", "--rounds", "2"]],
    "scale": [["--nodes", "100", "--pods", "1000"]],
    "plugin": [["--pods", "50"]],
    "server_cost": [["--writes", "200", "--rounds", "1", "--pod-shape", "workload"]],
    "admission_cost": [["--writes", "100", "--rounds", "1", "--pods", "4"]],
    "burst": [["--nodes", "10", "--pods", "80"]],
    "gangs": [["--gang-size", "4", "--nodes", "10", "--pods", "40"]],
    "sweep": [["--nodes", "300", "--pods", "2400", "--sweeps", "2"]],
}
SCRIPTS = {"gangs": "operator"}
"""Benchmarks that are a mode of another's script."""


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory = Path("/proc/meminfo").read_text().split()[1]
    return (
        f"{cpu}, {os.cpu_count()} cores, {int(memory) // 1024**2} GiB, {platform.machine()}, "
        f"Python {platform.python_version()}"
    )


def run_one(name: str, args: list[str], scratch: Path) -> dict[str, Any]:
    out = scratch / f"{name}-{len(list(scratch.iterdir()))}.json"
    started = time.monotonic()
    script = f"{SCRIPTS.get(name, name)}.py"
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(result.stdout.rstrip(), flush=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"bench/{SCRIPTS.get(name, name)}.py {' '.join(args)} failed:\n{result.stderr[-3000:]}"
        )
    report: dict[str, Any] = json.loads(out.read_text())
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib  # noqa: PLC0415  (a benchmark-only dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    drawn = []
    rows = report["results"]["packing"][0]["results"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    figure, axis = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        values = [
            next(r["mean_in_use"] for r in rows if r["workload"] == w and r["policy"] == policy)
            for w in workloads
        ]
        axis.bar([x + i * width for x in range(len(workloads))], values, width, label=policy)
    axis.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(workloads))])
    axis.set_xticklabels(workloads, fontsize=8)
    axis.set_ylim(0.5, 1.02)
    axis.set_ylabel("GPU memory in use at the first failure")
    axis.set_title(f"Packing ({report['machine']})", fontsize=8)
    axis.legend(fontsize=8)
    drawn.append(out / "packing.png")
    figure.savefig(drawn[-1], dpi=120, bbox_inches="tight")

    drawn.append(_plot_operator(report, out, plt))

    plugin = report["results"]["plugin"][0]["results"]
    figure, axis = plt.subplots(figsize=(6, 4))
    allocate = plugin["allocate"]
    keys = ("allocate_p50_ms", "allocate_p99_ms", "allocate_max_ms")
    axis.bar([k.split("_")[1] for k in keys], [allocate[k] for k in keys])
    axis.axhline(allocate["target_p99_ms"], color="red", linestyle="--", label="p99 target")
    axis.set_ylabel("Allocate latency, ms")
    axis.set_title(
        f"Allocate, {allocate['pods_bound_to_node']} pods on the node ({report['machine']})",
        fontsize=8,
    )
    axis.legend()
    drawn.append(out / "plugin.png")
    figure.savefig(drawn[-1], dpi=120, bbox_inches="tight")
    plt.close("all")
    return drawn


def _plot_operator(report: dict[str, Any], out: Path, plt: Any) -> Path:
    runs = report["results"]["operator"]
    nodes = [r["args"]["nodes"] for r in runs]
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(10, 4))
    raw = [r["results"]["raw"]["bound_per_s"] for r in runs]
    rate.plot(nodes, raw, "o-", color="grey", label="raw Binding")
    colors = {"kube-scheduler-raised": "C0", "kube-scheduler-default": "C1", "operator": "C2"}
    for who, color in colors.items():
        backlog = [r["results"][who]["backlog_bound_per_s"] for r in runs]
        p99 = [r["results"][who]["burst_create_to_bound_p99_ms"] for r in runs]
        rate.plot(nodes, backlog, "o-", color=color, label=who)
        latency.plot(nodes, p99, "o-", color=color, label=who)
    rate.set_xlabel("fake nodes x 8 cards")
    rate.set_ylabel("backlog: pods bound per second")
    rate.legend(fontsize=7)
    latency.set_xlabel("fake nodes x 8 cards")
    latency.set_ylabel("burst: create-to-bound p99, ms")
    latency.set_yscale("log")
    latency.legend(fontsize=7)
    figure.suptitle(f"Operator and kube-scheduler ({report['machine']})", fontsize=8)
    path = out / "operator.png"
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (the CI smoke test)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--only", nargs="*", choices=sorted(FULL), help="run only these")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(), "quick": args.quick, "results": {}}
    earlier = args.out / "report.json"
    if args.only and earlier.exists():
        # Re-run some benchmarks into a full report: the others' results stay, when they
        # were measured on this machine at the same sizes.
        kept = json.loads(earlier.read_text())
        if kept.get("machine") == report["machine"] and kept.get("quick") == args.quick:
            report["results"] = kept.get("results", {})
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as scratch:
        for name, runs in plan.items():
            if args.only and name not in args.only:
                continue
            print(f"\n== {name}", flush=True)
            report["results"][name] = [run_one(name, r, Path(scratch)) for r in runs]
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    drawn = plot(report, args.out) if set(report["results"]) >= set(plan) else []
    print(f"\nreport: {args.out / 'report.json'}; plots: {', '.join(str(p) for p in drawn)}")
    print(f"machine: {report['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

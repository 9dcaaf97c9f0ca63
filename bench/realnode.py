"""What the real 1.36 kubelet does with one device per memory unit, measured on real nodes
(`gpushare_harness.realnode`: the kubelet, containerd, runc; the device plugin on fake cards;
the operator):

- the size in bytes of a pod object (`kubectl get pod -o json`) asking 1024, 16384 and 40960
  MiB, at each unit: the kubelet writes every allocated device id into the pod's status;
- the largest pod that still runs at 1 MiB per device (Running in the API within a minute);
- the time the kubelet takes to admit a new pod after a restart with N GPU pods on the node;
- a burst: 40 pods of 2048 MiB created at once on the guide's node (8 x 11178 MiB) at the
  default unit, until all are Running, against 40 pods without a GPU on the same node in the
  same run (what the kubelet and containerd take on this machine, scheduler aside).

    python bench/realnode.py [--pods 100] [--units 1,64,512] [--burst-only] [--json out.json]

Needs root and the node packages (`make node-packages`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare.model import contract
from gpushare_harness.benchargs import positive
from gpushare_harness.crds import install_project_at
from gpushare_harness.nodeteardown import HOLDER
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.realnode import RealCluster, RealNode
from gpushare_harness.serverstats import cpu_seconds

SIZES_MIB = (1024, 16384, 40960)
WHOLE_H200_MIB = 143360  # a pod asking a whole 141 GiB card (140 GiB in whole GiB)
COARSE_FROM_MIB = 64  # the whole-card pod is measured from this unit up (143,360 ids at 1)
RESTART_POD_MIB = 512  # 100 such pods fit the guide's 8 x 11178 MiB node at every unit measured
RUN_TIMEOUT_S = 60.0


class Bench:
    def __init__(self, cluster: RealCluster, directory: Path) -> None:
        assert cluster.plane is not None
        self.cluster = cluster
        self.directory = directory
        self.kubeconfig = cluster.plane.kubeconfig
        self.kubectl_path = str(cluster.plane.binaries.kubectl)
        self.plugins: list[PluginProcess] = []
        self.components: dict[str, int] = {}
        """The operator's and the device plugins' pids, by name."""

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )

    def cpu_seconds(self, node: RealNode) -> dict[str, float]:
        """CPU seconds so far of the processes a burst on `node` keeps busy (containerd's
        shims and the containers themselves not counted)."""
        assert self.cluster.plane is not None
        pids = {**node.pids(), **self.cluster.plane.pids(), **self.components}
        pids.pop(HOLDER, None)
        return {name: cpu_seconds(pid) for name, pid in pids.items()}

    def node(self, name: str, cards: str, unit: int) -> RealNode:
        node = self.cluster.add_node(name)
        plugin = node.device_plugin(
            cards, self.directory / f"{name}-plugin.log", env={"GPU_MEMORY_FACTOR": str(unit)}
        )
        self.plugins.append(plugin.start(timeout_s=120))
        self.components[f"device-plugin-{name}"] = plugin.pid
        return node

    def create(self, name: str, node: str, units: int | None) -> None:
        self.create_all([name], node, units)

    def create_all(self, names: list[str], node: str, units: int | None) -> None:
        """Pods for `node` asking `units` of gpu-memory each (None: no GPU), in one request
        after another from one kubectl."""
        pods = [self.pod(name, node, units) for name in names]
        listed = {"apiVersion": "v1", "kind": "List", "items": pods}
        result = self.kubectl("create", "-f", "-", stdin=json.dumps(listed))
        if result.returncode != 0:
            raise RuntimeError(f"creating {', '.join(names)}: {result.stderr}")

    @staticmethod
    def pod(name: str, node: str, units: int | None) -> dict[str, Any]:
        limits = {} if units is None else {"volcano.sh/gpu-memory": str(units)}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "volcano",
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "cuda-container",
                        "image": "nvidia/cuda:9.0-devel",
                        "command": ["sleep", "100000"],
                        "resources": {"limits": limits},
                    }
                ],
            },
        }

    def pods(self) -> dict[str, dict[str, Any]]:
        listed = json.loads(self.kubectl("get", "pods", "-o", "json").stdout or '{"items":[]}')
        return {p["metadata"]["name"]: p for p in listed["items"]}

    def phases(self) -> dict[str, str]:
        return {name: p["status"].get("phase", "") for name, p in self.pods().items()}

    def milestones(
        self, names: list[str], timeout_s: float, *, gpu: bool = True
    ) -> dict[str, float | None]:
        """Seconds until all `names` were bound, assigned by the device plugin (`gpu` pods
        only) and Running (polled every 0.25 s; None for what did not happen within
        `timeout_s`)."""
        steps: dict[str, Callable[[dict[str, Any]], bool]] = {
            "bound": lambda p: bool(p["spec"].get("nodeName")),
            "assigned": lambda p: (
                p["metadata"].get("annotations", {}).get(contract.GPU_ASSIGNED)
                == contract.GPU_ASSIGNED_TRUE
            ),
            "running": lambda p: p["status"].get("phase") == "Running",
        }
        if not gpu:
            del steps["assigned"]
        reached: dict[str, float | None] = dict.fromkeys(steps)
        started = time.monotonic()
        while time.monotonic() - started < timeout_s and None in reached.values():
            pods = self.pods()
            for step, done in steps.items():
                if reached[step] is None and all(n in pods and done(pods[n]) for n in names):
                    reached[step] = round(time.monotonic() - started, 1)
            time.sleep(0.25)
        return reached

    def wait_running(self, names: list[str], timeout_s: float) -> float | None:
        """Seconds until all `names` are Running, or None after `timeout_s`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            phases = self.phases()
            if all(phases.get(name) == "Running" for name in names):
                return time.monotonic() - started
            if any(phases.get(name) == "Failed" for name in names):
                return None
            time.sleep(0.25)
        return None

    def delete_all(self) -> None:
        self.kubectl("delete", "pods", "--all", "--grace-period=0", "--force", "--wait=true")

    def pod_size(self, name: str) -> tuple[int, int, int]:
        """Bytes of `kubectl get pod -o json`, bytes of the pod as the apiserver sends it
        (compact JSON, what every watcher of pods receives), and device ids in its status."""
        text = self.kubectl("get", "pod", name, "-o", "json").stdout
        compact = self.kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{name}").stdout
        ids = 0
        for status in json.loads(text)["status"].get("containerStatuses", []):
            for resource in status.get("allocatedResourcesStatus", []):
                ids += len(resource["resources"])
        return len(text.encode()), len(compact.encode()), ids


def measure_sizes(bench: Bench, units: list[int]) -> list[dict[str, Any]]:
    rows = []
    for unit in units:
        node = f"size-u{unit}"
        bench.node(node, "1x147456", unit)
        sizes = (*SIZES_MIB, WHOLE_H200_MIB) if unit >= COARSE_FROM_MIB else SIZES_MIB
        for mib in sizes:
            name = f"size-{unit}-{mib}"
            count = math.ceil(mib / unit)
            bench.create(name, node, count)
            ran = bench.wait_running([name], RUN_TIMEOUT_S)
            deadline = time.monotonic() + 30
            size, compact, ids = bench.pod_size(name)
            while ran is not None and ids < count and time.monotonic() < deadline:
                time.sleep(0.5)
                size, compact, ids = bench.pod_size(name)
            rows.append(
                {"unit_mib": unit, "pod_mib": mib, "running": ran is not None,
                 "device_ids_in_status": ids, "pod_json_bytes": size,
                 "pod_compact_json_bytes": compact}
            )  # fmt: skip
            print(
                f"size: unit {unit} MiB, pod {mib} MiB: {size} bytes ({compact} compact), "
                f"{ids} ids",
                flush=True,
            )
            bench.delete_all()
    return rows


def largest_running_pod(bench: Bench) -> dict[str, Any]:
    """Bisect (4 GiB steps) the largest pod that reaches Running at 1 MiB per device."""
    node = "largest-u1"
    bench.node(node, "1x147456", 1)
    low, high = 0, 147456
    tries = []
    while high - low > 4096:
        mib = (low + high) // 2 // 1024 * 1024
        name = f"largest-{mib}"
        bench.create(name, node, mib)
        ran = bench.wait_running([name], RUN_TIMEOUT_S)
        size, _, ids = bench.pod_size(name)
        tries.append({"pod_mib": mib, "running": ran is not None, "pod_json_bytes": size,
                      "device_ids_in_status": ids})  # fmt: skip
        print(f"largest: {mib} MiB running={ran is not None} ({size} bytes)", flush=True)
        bench.delete_all()
        if ran is not None:
            low = mib
        else:
            high = mib
    return {"largest_running_mib": low, "first_failing_mib": high, "tries": tries}


def restart_admission(bench: Bench, unit: int, pods: int) -> dict[str, Any]:
    name = f"restart-u{unit}"
    node = bench.node(name, "8x11178", unit)
    units = math.ceil(RESTART_POD_MIB / unit)
    names = [f"r{unit}-{i}" for i in range(pods)]
    started = time.monotonic()
    for pod in names:
        bench.create(pod, name, units)
    filled = bench.wait_running(names, 60 + pods * 5)
    fill_s = None if filled is None else round(time.monotonic() - started, 1)
    print(f"restart: unit {unit}: {pods} pods Running in {fill_s} s", flush=True)
    started = time.monotonic()
    node.restart_kubelet(timeout_s=600)
    ready_s = time.monotonic() - started
    bench.create(f"new-{unit}", name, units)
    admitted = bench.wait_running([f"new-{unit}"], 600)
    total = time.monotonic() - started
    print(
        f"restart: unit {unit}: Ready after {ready_s:.1f} s, new pod Running "
        f"{'never' if admitted is None else f'{admitted:.1f} s after its creation'}",
        flush=True,
    )
    bench.delete_all()
    return {
        "unit_mib": unit,
        "pods_on_node": pods,
        "fill_seconds": fill_s,
        "kubelet_ready_seconds": round(ready_s, 1),
        "new_pod_admitted_seconds": None if admitted is None else round(admitted, 1),
        "restart_to_new_pod_running_seconds": round(total, 1),
    }


def device_path(log: Path, pods: set[str]) -> dict[str, float | None]:
    """What the device plugin spent on `pods` (namespace/name), from its log: the kubelet
    asks GetPreferredAllocation, then Allocate, one container after another as it admits
    pods; each answer's milliseconds, and within them the wait for the plugin's lock, for its
    watch to deliver the pod and for the kubelet's pod-resources records (which name the pod
    being admitted: the grants they identified are marked gpu-assigned at once)."""
    preferred: list[float] = []
    allocate: list[float] = []
    lock_wait: list[float] = []
    watch_wait: list[float] = []
    records: list[float] = []
    identified = 0
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("pod") not in pods:
            continue
        if entry.get("event") == "devices preferred":
            preferred.append(entry["preferred_ms"])
        elif entry.get("event") == "container allocated":
            allocate.append(entry["allocate_ms"])
            identified += bool(entry.get("identified"))
        else:
            continue
        lock_wait.append(entry["lock_wait_ms"])
        watch_wait.append(entry["watch_wait_ms"])
        records.append(entry.get("records_ms", 0.0))
    calls = sorted(preferred + allocate)
    reads = [ms for ms in records if ms]  # an Allocate of the ids just preferred reads none
    return {
        "calls": len(calls),
        "preferred_ms_total": round(sum(preferred), 1),
        "allocate_ms_total": round(sum(allocate), 1),
        "call_ms_p50": round(statistics.median(calls), 2) if calls else 0.0,
        "call_ms_max": round(calls[-1], 2) if calls else 0.0,
        "lock_wait_ms_total": round(sum(lock_wait), 1),
        "watch_wait_ms_total": round(sum(watch_wait), 1),
        "records_ms_total": round(sum(records), 1),
        "records_reads": len(reads),
        "grants_identified_by_kubelet_records": identified,
    }


def median_running(runs: list[dict[str, Any]], kind: str) -> float | None:
    """The median over `runs` of the seconds until all pods of `kind` were Running (None if
    they never were)."""
    seconds = [r[kind]["running"] for r in runs if r[kind]["running"] is not None]
    return statistics.median(seconds) if seconds else None


def burst_running(bench: Bench, pods: int = 40, runs: int = 5) -> dict[str, Any]:
    """`runs` times: `pods` without a GPU, then as many of 2048 MiB (in every other run the
    GPU pods first), each burst until all are Running; the medians, and each run."""
    node = "burst"
    burst = bench.node(node, "8x11178", contract.DEFAULT_MEMORY_UNIT_MIB)
    plugin_log = bench.directory / f"{node}-plugin.log"
    kinds = (("without_gpu", None), ("gpu_2048_mib", 2048 // contract.DEFAULT_MEMORY_UNIT_MIB))
    each: list[dict[str, Any]] = []
    for run in range(runs):
        found: dict[str, Any] = {}
        for kind, units in kinds if run % 2 == 0 else kinds[::-1]:
            names = [f"{kind.replace('_', '-')}-{run}-{i}" for i in range(pods)]
            before = bench.cpu_seconds(burst)
            bench.create_all(names, node, units)
            found[kind] = bench.milestones(names, 300, gpu=units is not None)
            after = bench.cpu_seconds(burst)
            found[kind]["cpu_seconds"] = {
                name: round(after[name] - before[name], 2) for name in before if name in after
            }
            if units is not None:
                found["device_path"] = device_path(plugin_log, {f"default/{n}" for n in names})
            print(
                f"burst {run}: {pods} pods {kind}: seconds after the last create {found[kind]}",
                flush=True,
            )
            bench.delete_all()
        plain, gpu = found["without_gpu"]["running"], found["gpu_2048_mib"]["running"]
        found["gpu_vs_without_gpu"] = None if not plain or gpu is None else round(gpu / plain, 2)
        print(f"burst {run}: GPU pods / pods without: {found['gpu_vs_without_gpu']}", flush=True)
        each.append(found)
    ratios = [r["gpu_vs_without_gpu"] for r in each if r["gpu_vs_without_gpu"] is not None]
    return {
        "pods": pods,
        "runs": each,
        "gpu_vs_without_gpu_median": round(statistics.median(ratios), 2) if ratios else None,
        "running_s_median": {kind: median_running(each, kind) for kind, _ in kinds},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--units", default=f"1,64,{contract.DEFAULT_MEMORY_UNIT_MIB}")
    parser.add_argument("--skip-largest", action="store_true")
    parser.add_argument("--burst-only", action="store_true", help="only the burst")
    parser.add_argument(
        "--runs", type=positive, default=5, help="bursts of each kind, taking turns"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    units = [int(u) for u in args.units.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="bench-realnode-"))
    cluster = RealCluster(directory).start()
    assert cluster.plane is not None
    bench = Bench(cluster, directory)
    operator = OperatorProcess(cluster.plane.kubeconfig, directory / "operator.log")
    report: dict[str, Any] = {"benchmark": "realnode", "units": units}
    try:
        install_project_at(cluster.plane.kubeconfig)
        operator.start()
        bench.components["operator"] = operator.pid
        report["burst"] = burst_running(bench, runs=args.runs)
        if not args.burst_only:
            report["pod_sizes"] = measure_sizes(bench, units)
            if not args.skip_largest:
                report["largest_at_1_mib"] = largest_running_pod(bench)
            report["restart"] = [restart_admission(bench, unit, args.pods) for unit in units]
    finally:
        operator.stop()
        for plugin in bench.plugins:
            plugin.stop()
        cluster.stop()
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

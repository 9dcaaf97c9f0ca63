"""What gpushare's admission policies cost a pod's status write, as the apiserver itself
measures it. A benchmark, not a test: it prints a table and writes JSON.

    python bench/admission_cost.py [--writes 2000] [--rounds 3] [--pods 20]
                                   [--pod-shape workload|minimal] [--json out.json]

On one fresh control plane, the shipped manifests applied as an admin applies them (every
policy and binding), pending pods of two kinds, `--pods` of each, all of one shape: GPU pods
as the admission webhook leaves them (labelled `gpushare.io/gpu-pod`), and the same pods
without their GPU limit and the label, as most pods of a cluster are. Each round sends
`--writes` status patches to each kind in turn (a condition's message, as kubelets write
status; one at a time, so that the apiserver's timings are of the work, not of a queue before
the cores; round robin over the pods, so that no write waits for another's; a new order each
round), and reads from the apiserver's /metrics, before and after each kind's writes:
- its ValidatingAdmissionPolicy step (`apiserver_admission_controller_admission_duration_
  seconds`, name ValidatingAdmissionPolicy, validate, UPDATE): seconds per write, the sum
  over the count (which also counts the few other updates the control plane makes meanwhile,
  its Leases', judged by no policy);
- the whole request (`apiserver_request_duration_seconds`, PATCH pods/status), the same way.
Each figure is the median over the rounds. Before 2026-12-07 the placement policy matched
every pod: every pod's status write cost what a GPU pod's costs here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.benchargs import positive
from gpushare_harness.benchpods import add_shape_argument, bench_pod
from gpushare_harness.benchreport import report
from gpushare_harness.serverstats import counters

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "base"
NAMESPACE = "cost"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
POLICY_STEP = "apiserver_admission_controller_admission_duration_seconds"
REQUEST = "apiserver_request_duration_seconds"
KINDS = {"gpu pod (labelled)": True, "pod without GPUs": False}


def pod(name: str, *, gpu: bool, shape: str) -> dict[str, Any]:
    limits = {contract.GPU_NUMBER: "1"} if gpu else {}
    return bench_pod(name, 0, scheduler=contract.DEFAULT_SCHEDULER_NAME, limits=limits, shape=shape)


def _counted(metric: str, labels: dict[str, str]) -> bool:
    """The samples of `metric` charged: the policy step of updates, PATCHes of pods/status."""
    if metric == POLICY_STEP:
        return (labels.get("name"), labels.get("type"), labels.get("operation")) == (
            "ValidatingAdmissionPolicy",
            "validate",
            "UPDATE",
        )
    return (labels.get("verb"), labels.get("resource"), labels.get("subresource")) == (
        "PATCH",
        "pods",
        "status",
    )


async def histograms(api: client.ApiClient) -> dict[str, tuple[float, float]]:
    """Seconds and samples of the two histograms, as the apiserver has them now."""
    answer = await api.call_api(
        "/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"]
    )
    async with answer:
        text = await answer.text()
    seconds = dict.fromkeys((POLICY_STEP, REQUEST), 0.0)
    samples = dict.fromkeys((POLICY_STEP, REQUEST), 0.0)
    wanted = {f"{metric}_{part}" for metric in seconds for part in ("sum", "count")}
    for sample, labels, value in counters(text, wanted):
        metric, _, part = sample.rpartition("_")
        if _counted(metric, labels):
            (seconds if part == "sum" else samples)[metric] += value
    return {metric: (seconds[metric], samples[metric]) for metric in seconds}


async def policies_in_force(core: client.CoreV1Api, gpu_pod: str) -> None:
    """Wait until the apiserver refuses an edit of the GPU pod's placement (a dry run): it
    loads policies a moment after they are written."""
    edit = {"metadata": {"annotations": {contract.GPU_INDEX: "7"}}}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            await kube.raw_json(
                core.patch_namespaced_pod(
                    gpu_pod, NAMESPACE, edit, dry_run="All", _preload_content=False
                )
            )
        except kube.ApiError as error:
            if error.status == 403:
                return
            raise
        await asyncio.sleep(0.5)
    raise RuntimeError("the placement policy was not in force after 30 s")


async def measure(api: client.ApiClient, names: list[str], writes: int) -> dict[str, float]:
    """`writes` status patches, one at a time, round robin over the pods `names`."""
    core = client.CoreV1Api(api)
    before = await histograms(api)
    for number in range(writes):
        condition = {"type": "gpushare.io/Bench", "status": "True", "message": str(number)}
        await kube.raw_json(
            core.patch_namespaced_pod_status(
                names[number % len(names)],
                NAMESPACE,
                {"status": {"conditions": [condition]}},
                _content_type=STRATEGIC_MERGE,  # type: ignore[call-arg]
                _preload_content=False,
            )
        )
    after = await histograms(api)
    found = {}
    for metric, key in ((POLICY_STEP, "policy_step_us"), (REQUEST, "request_us")):
        total = after[metric][0] - before[metric][0]
        count = after[metric][1] - before[metric][1]
        if count < writes:
            raise RuntimeError(f"{metric}: {count:.0f} samples for {writes} writes")
        found[key] = round(total / count * 1e6, 1)
    return found


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plane = ControlPlane(workdir / "plane").start()
    measured: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        kubectl = [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig)]
        apply = [*kubectl, "apply", "-k", str(MANIFESTS)]
        await asyncio.to_thread(subprocess.run, apply, check=True, capture_output=True)
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": NAMESPACE}}))
            names: dict[str, list[str]] = {}
            for number, (kind, gpu) in enumerate(KINDS.items()):
                names[kind] = [f"kind-{number}-pod-{n}" for n in range(args.pods)]
                for name in names[kind]:
                    body = pod(name, gpu=gpu, shape=args.pod_shape)
                    await kube.raw_json(
                        core.create_namespaced_pod(
                            NAMESPACE, cast(client.V1Pod, body), _preload_content=False
                        )
                    )
            await policies_in_force(core, names[next(iter(KINDS))][0])
            kinds = list(KINDS)
            for number in range(args.rounds):
                shift = number % len(kinds)
                for kind in kinds[shift:] + kinds[:shift]:
                    found = await measure(api, names[kind], args.writes)
                    measured[kind].append(found)
                    print(f"round {number}, {kind}: {found}", flush=True)
    finally:
        plane.stop()
    return {
        kind: {key: round(statistics.median(r[key] for r in rounds), 1) for key in rounds[0]}
        | {"rounds": rounds}
        for kind, rounds in measured.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writes", type=positive, default=2000)
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--pods", type=positive, default=20, help="pods of each kind")
    add_shape_argument(parser, default="workload", pods="the pods written")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpushare-admission-cost-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    report(f"{args.writes} status writes per kind of pod, {args.rounds} rounds", results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

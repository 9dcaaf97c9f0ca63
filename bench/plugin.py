"""Device-plugin benchmark: Allocate latency with many pods on the node, and the ListAndWatch
message for large cards. A benchmark, not a test: it prints a table and writes JSON.

    python bench/plugin.py [--pods 500] [--json out.json]

1. ListAndWatch: for the guide's node (8 x 11178 MiB) and for 8 x 141 GiB cards (144384
   MiB, an H200 node) at the unit the plugin chooses with --gpu-memory-factor=auto: the
   message size (protobuf's own count) against the kubelet's 4 MiB limit, the time to build
   it (done once, before registering), and the time from opening the stream to the first
   full message over the plugin's unix socket (what the kubelet waits).
2. Allocate: on a real control plane, N pods (128 MiB each, spread over 8 x 81920 MiB cards
   served at 4 MiB per device) are bound to one node with `gpu-index` and `predicate-time`,
   as the operator binds them. The plugin runs as its own process. Acting as the kubelet,
   the benchmark calls Allocate once per pod (32 device ids, one container), one call at a
   time as a kubelet admits pods, serving the kubelet's pod-resources records as they would
   read then (every pod admitted so far holding its ids, the one being admitted none yet);
   each call reads them, takes the pod they name from the watch cache and builds the env (it
   writes nothing itself; a pod the records named is marked `gpu-assigned` at once, its write
   apart from the call). Latency per call, as the caller sees it: p50, p99. Then, as the
   kubelet admitting them, every pod's phase is set Running, and the time from the last call
   until all are marked is measured (how far the marks trail the calls).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import grpc
from kubernetes_asyncio import client

from gpushare import kube, logs
from gpushare.model import contract
from gpushare.model.annotations import gpu_assigned
from gpushare.model.devices import KUBELET_MESSAGE_LIMIT, smallest_fitting_unit
from gpushare.model.request import GpuKind
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_crds
from gpushare_harness.plugin import PluginProcess, pod_resources_socket
from gpushare_plugin._proto.podresources_v1 import api_pb2 as records_pb2
from gpushare_plugin._proto.podresources_v1 import api_pb2_grpc as records_grpc
from gpushare_plugin._proto.v1beta1 import api_pb2, api_pb2_grpc
from gpushare_plugin.allocator import Allocator
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.lifecycle import SOCKET_NAMES, Supervisor
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.server import DevicePluginServicer

H200_MIB = 144384
CARD_MIB = 81920
UNIT_MIB = 4  # 8 x 80 GiB at 1 MiB per device is over the kubelet's limit (Volcano's bug)
POD_UNITS = 32  # 128 MiB


async def first_message(spec: str, socket_dir: Path) -> dict[str, Any]:
    """Serve `spec` at the auto unit in this process; time the first ListAndWatch message."""
    cards = FakeDiscovery(spec, node="bench").cards()
    table = DeviceTable(node="bench", cards=cards, unit_mib=1)
    table.unit_mib = smallest_fitting_unit(table.sizes())
    metrics = PluginMetrics()
    allocator = cast(Allocator, None)  # ListAndWatch never allocates
    servicer = DevicePluginServicer(
        kind=GpuKind.MEMORY, table=table, allocator=allocator, metrics=metrics
    )
    built = time.perf_counter()
    servicer.current()
    build_s = time.perf_counter() - built
    stop = asyncio.Event()
    supervisor = Supervisor(socket_dir=socket_dir, servicers=[servicer])
    serving = asyncio.create_task(supervisor.run(stop))  # serves, then waits for a kubelet
    path = socket_dir / SOCKET_NAMES[GpuKind.MEMORY]
    while not path.exists():  # noqa: ASYNC110  # a file appears: no event to wait on
        await asyncio.sleep(0.01)
    options = [("grpc.max_receive_message_length", KUBELET_MESSAGE_LIMIT)]  # the kubelet's
    async with grpc.aio.insecure_channel(f"unix://{path}", options=options) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        await stub.GetDevicePluginOptions(api_pb2.Empty())  # connected, as the kubelet is
        started = time.perf_counter()
        stream = stub.ListAndWatch(api_pb2.Empty())
        message = await stream.read()
        elapsed = time.perf_counter() - started
        stream.cancel()
    stop.set()
    await serving
    return {
        "cards": spec,
        "unit_mib": table.unit_mib,
        "devices": len(message.devices),
        "bytes": message.ByteSize(),
        "limit_bytes": KUBELET_MESSAGE_LIMIT,
        "build_ms": round(build_s * 1000, 1),
        "first_message_ms": round(elapsed * 1000, 1),
    }


class KubeletRecords(records_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources `List` while it admits the benchmark's pods in order: the
    plugin reads it in every Allocate to know which pod the call is for. Each answer is built
    before the call it serves: of this stand-in's work, the latency measured holds only the
    answer's encoding (about 0.3 ms for 500 pods)."""

    def __init__(self, ids: list[str]) -> None:
        self._holding = records_pb2.ContainerDevices(
            resource_name=contract.GPU_MEMORY, device_ids=ids
        )
        self._admitted: list[records_pb2.PodResources] = []
        self._answer = records_pb2.ListPodResourcesResponse()

    def admit(self, number: int) -> None:
        """Pod `number` is being admitted; those before it hold their ids."""
        if self._admitted:
            self._admitted[-1].containers[0].devices.append(self._holding)
        self._admitted.append(
            records_pb2.PodResources(
                name=pod_name(number),
                namespace="default",
                containers=[records_pb2.ContainerResources(name="c")],
            )
        )
        self._answer = records_pb2.ListPodResourcesResponse(pod_resources=self._admitted)

    async def List(  # the gRPC method's name
        self, request: records_pb2.ListPodResourcesRequest, context: object
    ) -> records_pb2.ListPodResourcesResponse:
        return self._answer


def pod_name(number: int) -> str:
    return f"p-{number:04d}"


async def bound_pods(core: client.CoreV1Api, node: str, count: int) -> None:
    """`count` pods bound to `node` as the operator binds them, 16 in flight."""
    limit = asyncio.Semaphore(16)

    async def one(number: int) -> None:
        name = pod_name(number)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "volcano",
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {contract.GPU_MEMORY: str(POD_UNITS)}},
                    }
                ],
            },
        }
        async with limit:
            created = await kube.raw_json(
                core.create_namespaced_pod(
                    "default", cast(client.V1Pod, body), _preload_content=False
                )
            )
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": name,
                    "uid": created["metadata"]["uid"],
                    "annotations": {
                        contract.GPU_INDEX: str(number % 8),
                        contract.PREDICATE_TIME: str(time.time_ns()),
                    },
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            await kube.raw_json(
                core.create_namespaced_pod_binding(
                    name, "default", cast(client.V1Binding, binding), _preload_content=False
                )
            )

    await asyncio.gather(*(one(i) for i in range(count)))


async def admit_all(core: client.CoreV1Api, *, seconds: float) -> int:
    """Act as the kubelet admitting every pod (phase Running), then wait for the plugin to
    mark them `gpu-assigned`; how many it marked within `seconds`."""
    listed = await kube.raw_json(core.list_namespaced_pod("default", _preload_content=False))
    limit = asyncio.Semaphore(16)

    async def admit(name: str) -> None:
        async with limit:
            await kube.raw_json(
                core.patch_namespaced_pod_status(
                    name, "default", {"status": {"phase": "Running"}}, _preload_content=False
                )
            )

    await asyncio.gather(*(admit(p["metadata"]["name"]) for p in listed["items"]))
    deadline = time.monotonic() + seconds
    while True:
        listed = await kube.raw_json(core.list_namespaced_pod("default", _preload_content=False))
        assigned = sum(
            1 for p in listed["items"] if gpu_assigned(p["metadata"].get("annotations", {}))
        )
        if assigned == len(listed["items"]) or time.monotonic() > deadline:
            return assigned
        await asyncio.sleep(0.2)


async def allocate_latency(pods: int, workdir: Path) -> dict[str, Any]:
    with ControlPlane(workdir / "plane") as plane:
        async with await kube.api_client(plane.kubeconfig) as api:
            await install_crds(api)
            core = client.CoreV1Api(api)
            await create_gpu_node(core, FakeGpuNode(name="gpu-node", gpu_memory=0, gpu_number=0))
            await bound_pods(core, "gpu-node", pods)
            async with contextlib.AsyncExitStack() as stack:
                node_dir = Path(tempfile.mkdtemp(prefix="bench-dp-"))
                stack.callback(shutil.rmtree, node_dir, ignore_errors=True)
                socket_dir = node_dir / "device-plugins"
                socket_dir.mkdir()
                ids = [f"0-{k}" for k in range(POD_UNITS)]
                records = KubeletRecords(ids)
                records_path = pod_resources_socket(socket_dir)
                records_path.parent.mkdir()
                kubelet = grpc.aio.server()
                records_grpc.add_PodResourcesListerServicer_to_server(records, kubelet)  # type: ignore[no-untyped-call]
                kubelet.add_insecure_port(f"unix://{records_path}")
                await kubelet.start()  # before the plugin: it reads the records once at start
                stack.push_async_callback(kubelet.stop, None)
                plugin = PluginProcess(
                    node="gpu-node",
                    kubeconfig=plane.kubeconfig,
                    socket_dir=socket_dir,
                    fake_gpus=f"8x{CARD_MIB}",
                    log=workdir / "plugin.log",
                    args=[f"--gpu-memory-factor={UNIT_MIB}"],
                )
                stack.callback(plugin.stop)
                plugin.start(wait_registered=False)
                await asyncio.to_thread(plugin.wait_logged, "waiting for the kubelet", timeout_s=60)
                path = socket_dir / SOCKET_NAMES[GpuKind.MEMORY]
                latencies = []
                async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                    stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                    request = api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                    )
                    records.admit(0)
                    await stub.Allocate(request)  # warm-up: connection, first decision
                    for number in range(1, pods):
                        records.admit(number)
                        started = time.perf_counter()
                        await stub.Allocate(request)
                        latencies.append(time.perf_counter() - started)
                last_call = time.perf_counter()
                assigned = await admit_all(core, seconds=60)
                marked_s = time.perf_counter() - last_call
    ordered = sorted(latencies)
    return {
        "pods_bound_to_node": pods,
        "calls_timed": len(latencies),
        "pods_marked_assigned": assigned,
        "last_call_to_all_marked_s": round(marked_s, 2),
        "allocate_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "allocate_p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        "allocate_max_ms": round(ordered[-1] * 1000, 2),
        "target_p99_ms": 20,
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    socket_dir = Path(tempfile.mkdtemp(prefix="bench-law-"))
    try:
        guide = await first_message("8x11178", socket_dir)
        h200 = await first_message(f"8x{H200_MIB}", socket_dir)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    return {
        "list_and_watch": [guide, h200],
        "allocate": await allocate_latency(args.pods, workdir),
    }


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    logs.configure("warning")
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    print(f"device plugin; {machine()}")
    print(
        f"  {'ListAndWatch':<14} {'unit MiB':>9} {'devices':>9} {'bytes':>10} "
        f"{'build ms':>9} {'first ms':>9}"
    )
    for row in results["list_and_watch"]:
        print(
            f"  {row['cards']:<14} {row['unit_mib']:>9} {row['devices']:>9} "
            f"{row['bytes']:>10} {row['build_ms']:>9} {row['first_message_ms']:>9}"
        )
    for key, value in results["allocate"].items():
        print(f"  {key:<22} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The user guide, end to end, on this machine: `gpushare-dev demo` (`make demo`).

It starts a whole local cluster (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) and the guide's node `gpu-node-1` as a real node (the kubelet, kube-proxy,
containerd and runc, in namespaces of its own; `gpushare_harness.realnode`), then installs
gpushare the way the README tells admins to: the two images built from the Dockerfiles and
imported into the node's containerd, the node labelled `gpushare=true`, and `kubectl apply -k
manifests/overlays/dev` (the operator Deployment, and the device plugin's DaemonSet on 8 fake
cards of 11178 MiB). A second, heterogeneous node `gpu-node-2` has only the kubelet's device
manager (`kubelet-devices`: no containers run there), with the device plugin beside it as a
process. Then the guide's gpu-pod1 and gpu-pod2 are applied unchanged and the demo shows what
the guide shows, the env through a real `kubectl exec`. Everything keeps running afterwards;
`gpushare-dev down` stops it all.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from kubernetes_asyncio import client

from gpushare.kube import api_client, raw_json
from gpushare.model import contract
from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.imagebuild import build_images
from gpushare_harness.kubelet import KubeletHarness
from gpushare_harness.nodes import FakeGpuNode, create_gpu_node
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.realnode import RealCluster, RealNode

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
EXAMPLES = MANIFESTS / "examples"
REAL_NODE = "gpu-node-1"  # the guide's node: 8 cards of 11178 MiB (manifests/overlays/dev)
FAKE_NODE = ("gpu-node-2", "1x81920,1x40960,2x24576")  # heterogeneous cards
GUIDE_PODS = ("gpu-pod1", "gpu-pod2")
GUIDE_CARD_MIB = 11178  # the guide's GTX 1080 Ti


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def kubectl(kubeconfig: Path, *args: str, timeout_s: float = 60) -> str:
    binary = ensure_binaries().kubectl
    shown = " ".join(args)
    print(f"$ kubectl {shown}", flush=True)
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {shown} failed: {result.stderr.strip()}")
    print(result.stdout.rstrip(), flush=True)
    return result.stdout


def gpushare(kubeconfig: Path, *args: str) -> None:
    print(f"$ gpushare {' '.join(args)}", flush=True)
    result = subprocess.run(
        [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    print((result.stdout or result.stderr).rstrip(), flush=True)


async def _create_fake_node(kubeconfig: Path, name: str) -> None:
    async with await api_client(kubeconfig) as api:
        await create_gpu_node(
            client.CoreV1Api(api), FakeGpuNode(name=name, gpu_memory=0, gpu_number=0)
        )


async def _wait_running(kubeconfig: Path, names: tuple[str, ...], timeout_s: float) -> None:
    """Until the pods run and the device plugin, having seen them started, marked them."""
    async with await api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pods = await raw_json(core.list_namespaced_pod("default", _preload_content=False))
            states = {
                p["metadata"]["name"]: (
                    p["status"].get("phase"),
                    (p["metadata"].get("annotations") or {}).get(contract.GPU_ASSIGNED),
                )
                for p in pods["items"]
            }
            if all(states.get(name) == ("Running", "true") for name in names):
                return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"the guide's pods are not Running after {timeout_s} s: {states}")


def install(node: RealNode, kubeconfig: Path) -> None:
    """gpushare on the real node as the README's install: images, label, kubectl apply -k."""
    section("install gpushare as an admin does: images, the node's label, kubectl apply -k")
    print("$ gpushare-dev images   (docker/*.Dockerfile, built with buildah)", flush=True)
    for image in build_images().values():
        print(f"{image.name}: {image.size_bytes / 1e6:.0f} MB", flush=True)
        print(f"$ ctr -n k8s.io images import {image.archive.name}   (on {node.name})")
        node.import_image(image.archive)
    kubectl(kubeconfig, "label", "node", node.name, "gpushare=true")
    kubectl(kubeconfig, "apply", "-k", str(MANIFESTS / "overlays" / "dev"))
    for namespace, workload in (
        ("gpushare-system", "deployment/gpushare-operator"),
        ("gpushare-device-plugin", "daemonset/gpushare-device-plugin"),
    ):
        kubectl(
            kubeconfig, "-n", namespace, "rollout", "status", workload, "--timeout=240s",
            timeout_s=300,
        )  # fmt: skip
    kubectl(kubeconfig, "get", "pods", "-A", "-o", "wide")


def start_components(cluster: RealCluster, pids: dict[str, int]) -> None:
    """The real node with gpushare installed on it, then the fake node (kubelet-devices and
    a device plugin process); their pids go into `pids` as each starts (so a failure stops
    them)."""
    assert cluster.plane is not None
    directory, kubeconfig = cluster.directory, cluster.plane.kubeconfig
    install(cluster.add_node(REAL_NODE), kubeconfig)
    name, cards = FAKE_NODE
    asyncio.run(_create_fake_node(kubeconfig, name))
    # Short (a unix socket path has at most 107 bytes); its kubelet's pod-resources socket
    # beside it, in the demo's folder.
    plugin_dir = directory / "dp"
    kubelet = KubeletHarness(
        node=name,
        kubeconfig=kubeconfig,
        plugin_dir=plugin_dir,
        log=directory / f"{name}-kubelet-devices.log",
        detached=True,
    ).start()
    pids[f"{name}-kubelet-devices"] = kubelet.pid
    plugin = PluginProcess(
        node=name,
        kubeconfig=kubeconfig,
        socket_dir=plugin_dir,
        fake_gpus=cards,
        log=directory / f"{name}-device-plugin.log",
        detached=True,
    )
    pids[f"{name}-device-plugin"] = plugin.start(timeout_s=60).pid


def show(directory: Path, kubeconfig: Path) -> None:
    """Apply the guide's pods and show what the guide shows."""
    unit = contract.DEFAULT_MEMORY_UNIT_MIB
    section(
        f"nodes: the device plugins advertise GPU memory in devices of {unit} MiB, and cards "
        "(the guide's node first)"
    )
    columns = (
        "custom-columns=NAME:.metadata.name,"
        "GPU-MEMORY:.status.allocatable.volcano\\.sh/gpu-memory,"
        "GPU-NUMBER:.status.allocatable.volcano\\.sh/gpu-number"
    )
    devices = str(8 * (GUIDE_CARD_MIB // unit))
    deadline = time.monotonic() + 30
    while devices not in kubectl_quiet(kubeconfig, "get", "nodes", "-o", columns):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gpu-node-1 never showed {devices} gpu-memory devices")
        time.sleep(0.5)
    kubectl(kubeconfig, "get", "nodes", "-o", columns)
    section("the admission webhook answers (a server-side dry run creates nothing)")
    guide = str(EXAMPLES / f"{GUIDE_PODS[0]}.yaml")
    deadline = time.monotonic() + 60
    while kubectl_status(kubeconfig, "create", "--dry-run=server", "-f", guide) != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the admission webhook never answered: see the operator's log")
        time.sleep(1)
    kubectl(kubeconfig, "create", "--dry-run=server", "-f", guide)
    section("the guide's two pods, applied unchanged (1024 MiB each)")
    for name in GUIDE_PODS:
        kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / f"{name}.yaml"))
    asyncio.run(_wait_running(kubeconfig, GUIDE_PODS, timeout_s=60))
    kubectl(kubeconfig, "get", "pods", "-o", "wide")
    section("the scheduler's annotations (gpu-assigned is the device plugin's)")
    keys = (contract.GPU_INDEX, contract.PREDICATE_TIME, contract.GPU_ASSIGNED)
    shown = ["NAME:.metadata.name"] + [
        key.split("/")[1].upper() + ":.metadata.annotations." + key.replace(".", "\\.")
        for key in keys
    ]
    annotations = "custom-columns=" + ",".join(shown)
    kubectl(kubeconfig, "get", "pods", "-o", annotations)
    section(f"the webhook stored their limits in {unit} MiB devices and kept the MiB asked")
    converted = (
        "custom-columns=NAME:.metadata.name,"
        "LIMIT:.spec.containers[0].resources.limits.volcano\\.sh/gpu-memory,"
        "UNIT-MIB:.metadata.annotations.gpushare\\.io/memory-unit-mib,"
        "MIB:.metadata.annotations.gpushare\\.io/gpu-memory-mib"
    )
    kubectl(kubeconfig, "get", "pods", "-o", converted)
    section("inside the containers: the env the device plugin gave them, through the kubelet")
    for name in GUIDE_PODS:
        kubectl(kubeconfig, "exec", name, "--", "env")
    section("the cards")
    kubectl(kubeconfig, "get", "gpunodes")
    gpushare(kubeconfig, "inspect")
    gpushare(kubeconfig, "inspect", "gpu-node-1", "-d")


def kubectl_status(kubeconfig: Path, *args: str) -> int:
    result = subprocess.run(
        [str(ensure_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return result.returncode


def kubectl_quiet(kubeconfig: Path, *args: str) -> str:
    result = subprocess.run(
        [str(ensure_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result.stdout

"""`gpushare-dev`: the local control plane for people.

    gpushare-dev demo [--dir D]        the user guide end to end (see gpushare_harness.demo);
                                       leaves everything running
    gpushare-dev build                 build (or find) the Go binaries: kube-apiserver,
                                       etcd, kubectl, kubelet, kube-proxy, ...
    gpushare-dev images [--base OCI]   build (or find) the operator and device-plugin
                                       images from docker/*.Dockerfile (buildah, no engine):
                                       OCI archives to import into a node's containerd
    gpushare-dev release [--out dist] [--registry R] [--download-url U]
                                       the versioned artifacts in dist/<version>/: images
                                       (OCI archives, digests), chart, CLI wheel, kubectl
                                       plugin and krew manifest, SBOMs, SHA256SUMS
    gpushare-dev up [--dir D]          start etcd + kube-apiserver, install the CRDs,
                                       print the kubeconfig to use (kopf run, kubectl)
    gpushare-dev status [--dir D]      is it running, and where
    gpushare-dev add-node NAME --gpu-memory 89424 --gpu-number 8
                                       a fake GPU node (status as a kubelet would write it)
    gpushare-dev down [--dir D]        stop it all (the demo's processes too), delete state

State lives in --dir (default ~/.cache/gpushare/cluster): certificates, kubeconfig, logs,
etcd data and state.json with the process ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from gpushare.kube import ApiError, api_client
from gpushare_harness import demo
from gpushare_harness.binaries import BuildError, cache_dir, ensure_binaries
from gpushare_harness.controlplane import ControlPlane, ControlPlaneError, alive, terminate
from gpushare_harness.crds import install_project_at
from gpushare_harness.imagebuild import SIZE_GOAL_BYTES, ImageBuildError, build_images
from gpushare_harness.kubelet import KubeletUnavailable
from gpushare_harness.network import ClusterNetwork
from gpushare_harness.nodes import FakeGpuNode, create_gpu_node
from gpushare_harness.realnode import RealCluster, RealNodeError
from gpushare_harness.release import DEFAULT_REGISTRY, ReleaseError, make_release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpushare-dev",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build or find the Kubernetes binaries")
    images = commands.add_parser(
        "images", help="build or find the operator and device-plugin images"
    )
    images.add_argument(
        "--base", type=Path, help="an OCI archive of the base image (default: Debian's, made here)"
    )
    release = commands.add_parser("release", help="write the versioned release artifacts")
    release.add_argument("--out", type=Path, default=Path("dist"))
    release.add_argument(
        "--registry", default=DEFAULT_REGISTRY, help="where the images will be pushed"
    )
    release.add_argument(
        "--download-url", help="where the kubectl plugin's archive will be published (krew)"
    )
    for name in ("demo", "up", "status", "env", "down"):
        command = commands.add_parser(name)
        command.add_argument("--dir", type=Path, default=cache_dir() / "cluster")
    add_node = commands.add_parser("add-node", help="create a fake GPU node")
    add_node.add_argument("name")
    add_node.add_argument("--gpu-memory", type=int, required=True, help="units, all cards")
    add_node.add_argument("--gpu-number", type=int, required=True, help="cards")
    add_node.add_argument("--dir", type=Path, default=cache_dir() / "cluster")
    args = parser.parse_args(argv)
    run: dict[str, Callable[[], int]] = {
        "build": _build,
        "images": lambda: _images(args.base),
        "release": lambda: _release(args.out, args.registry, args.download_url),
        "demo": lambda: _demo(args.dir),
        "up": lambda: _up(args.dir),
        "status": lambda: _status(args.dir),
        "env": lambda: _env(args.dir),
        "down": lambda: _down(args.dir),
        "add-node": lambda: _add_node(
            args.dir,
            FakeGpuNode(name=args.name, gpu_memory=args.gpu_memory, gpu_number=args.gpu_number),
        ),
    }
    try:
        return run[args.command]()
    except (
        BuildError,
        ImageBuildError,
        ControlPlaneError,
        ApiError,
        client.ApiException,
        KubeletUnavailable,
        RealNodeError,
        ReleaseError,
        RuntimeError,
    ) as error:
        print(f"gpushare-dev {args.command}: {error}", file=sys.stderr)
        return 1


def _release(out: Path, registry: str, download_url: str | None) -> int:
    folder = make_release(out, registry=registry, download_url=download_url)
    for path in sorted(folder.iterdir()):
        print(f"  {path.name}")
    return 0


def _images(base: Path | None) -> int:
    for image in build_images(base=base).values():
        goal = "" if image.size_bytes <= SIZE_GOAL_BYTES else " (over the 200 MB goal)"
        print(
            f"{image.name}: {image.size_bytes / 1e6:.0f} MB unpacked{goal}, "
            f"{image.archive_bytes / 1e6:.0f} MB archive {image.archive}"
        )
    return 0


def _build() -> int:
    found = {path.name: str(path) for path in ensure_binaries().paths().values()}
    print(json.dumps(found, indent=2))
    return 0


def _state(directory: Path) -> dict[str, Any] | None:
    path = directory / "state.json"
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def _running(state: dict[str, Any] | None) -> bool:
    return state is not None and all(alive(pid) for pid in state["pids"].values())


def _up(directory: Path) -> int:
    state = _state(directory)
    if _running(state):
        assert state is not None
        print(f"already running: {state['server']}\nexport KUBECONFIG={state['kubeconfig']}")
        return 0
    if state is not None:
        _stop(state)
    shutil.rmtree(directory, ignore_errors=True)
    plane = ControlPlane(directory, die_with_parent=False).start()
    try:
        install_project_at(plane.kubeconfig)
    except BaseException:
        plane.stop()
        raise
    (directory / "state.json").write_text(plane.to_json())
    print(
        f"control plane ready at {plane.describe()['server']}; logs in {directory}\n"
        f"export KUBECONFIG={plane.kubeconfig}\n"
        f"stop it with: gpushare-dev down"
        + (f" --dir {directory}" if directory != cache_dir() / "cluster" else "")
    )
    return 0


def _demo(directory: Path) -> int:
    if _state(directory) is not None:
        _down(directory)  # a fresh demo: the guide's pods on an empty cluster
    shutil.rmtree(directory, ignore_errors=True)
    cluster = RealCluster(directory, detached=True)
    components: dict[str, int] = {}
    try:
        cluster.start()
        assert cluster.plane is not None
        kubeconfig = cluster.plane.kubeconfig
        demo.start_components(cluster, components)
    except BaseException:
        _stop({"components": components, **(cluster.describe() if cluster.plane else {})})
        cluster.stop()
        raise
    (directory / "state.json").write_text(
        json.dumps({**cluster.describe(), "components": components}, indent=2)
    )
    demo.show(directory, kubeconfig)
    flag = f" --dir {directory}" if directory != cache_dir() / "cluster" else ""
    exports = "\n".join(f"  {line}" for line in _exports(kubeconfig))
    print(
        f"\nEverything keeps running. Go on with kubectl, gpushare and kubectl gpushare\n"
        f'(or: eval "$(.venv/bin/gpushare-dev env)"):\n'
        f"{exports}\n"
        f"  kubectl get gpunodes; kubectl get pods -o wide; kubectl gpushare inspect\n"
        f"  kubectl exec gpu-pod1 -- env\n"
        f"Logs: {directory}/*.log; the real node's: {cluster.nodes[demo.REAL_NODE].directory}\n"
        f"Stop it all: " + (f"gpushare-dev down{flag}" if flag else "make down")
    )
    return 0


def _exports(kubeconfig: Path) -> list[str]:
    """The shell lines that put the running cluster's kubectl, gpushare and kubectl-gpushare
    on the PATH and point them at it."""
    tools = [ensure_binaries(log=False).kubectl.parent, Path(sys.executable).parent]
    return [
        f"export KUBECONFIG={kubeconfig}",
        f"export PATH={':'.join(str(t) for t in tools)}:$PATH",
    ]


def _env(directory: Path) -> int:
    state = _state(directory)
    if not _running(state):
        print(f"gpushare-dev env: no cluster is running (state in {directory})", file=sys.stderr)
        return 1
    assert state is not None
    print("\n".join(_exports(Path(state["kubeconfig"]))))
    return 0


def _status(directory: Path) -> int:
    state = _state(directory)
    if not _running(state):
        print(f"not running (state in {directory})")
        return 1
    print(json.dumps(state, indent=2))
    return 0


def _stop(state: dict[str, Any]) -> None:
    """The demo's components first, then its real nodes, the controllers, kube-apiserver (it
    shuts down slowly without etcd), etcd, and the nodes' bridge; SIGKILL after 10 s each."""
    pids: dict[str, int] = state.get("pids", {})
    components: dict[str, int] = state.get("components", {})
    for pid in components.values():
        _end(pid)
    RealCluster.stop_recorded_nodes(state)
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        if name in pids:
            _end(pids[name])
    if "network" in state:
        ClusterNetwork.from_json(state["network"]).delete()


def _end(pid: int) -> None:
    terminate(pid)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        terminate(pid, signal.SIGKILL)


def _down(directory: Path) -> int:
    state = _state(directory)
    if state is None:
        print(f"not running (no state in {directory})")
        return 0
    _stop(state)
    shutil.rmtree(directory, ignore_errors=True)
    print("control plane stopped")
    return 0


def _add_node(directory: Path, node: FakeGpuNode) -> int:
    state = _state(directory)
    if not _running(state):
        print(
            f"gpushare-dev add-node: no control plane in {directory}; run gpushare-dev up",
            file=sys.stderr,
        )
        return 1
    assert state is not None

    async def create() -> None:
        async with await api_client(Path(state["kubeconfig"])) as api:
            await create_gpu_node(client.CoreV1Api(api), node)

    try:
        asyncio.run(create())
    except client.ApiException as error:
        if error.status != 409:
            raise
        print(f"node {node.name} already exists")
        return 0
    print(f"node {node.name}: {node.gpu_number} cards, {node.gpu_memory} units of gpu-memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())

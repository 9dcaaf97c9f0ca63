"""kube-apiserver, on the host, opens connections to pods on the real nodes as a real
cluster's does (what an admission webhook whose endpoints are pods needs, and
`kubectl get --raw .../pods/NAME:PORT/proxy/`): each node's pods get a /24 of their own, and
the host one route to it via the node's address on the cluster's bridge, deleted with the
node. Nothing else changes on the host: its ip_forward stays as it was.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cluster import create_pod, eventually, read_pod
from kubernetes_asyncio import client

from gpushare import kube
from gpushare_harness import ControlPlane
from gpushare_harness.nodeteardown import HOLDER
from gpushare_harness.realnode import RealCluster, RealNode, RealNodeError, check_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

NODES = ("reach-node-1", "reach-node-2")
PORT = 8080


def host_ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


@pytest.fixture(scope="module")
def real(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealCluster]:
    try:
        check_prerequisites()
    except RealNodeError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    directory = tmp_path_factory.mktemp("reach")
    cluster = RealCluster(directory, binaries=control_plane.binaries)
    try:
        cluster.start()
        for name in NODES:
            cluster.add_node(name)
        yield cluster
    finally:
        for name, node in cluster.nodes.items():  # kept for a failure's reader
            for log in ("kubelet.log", "containerd.log"):
                if (node.directory / log).is_file():
                    shutil.copy(node.directory / log, directory / f"{name}-{log}")
        cluster.stop()


@pytest_asyncio.fixture
async def core(real: RealCluster) -> AsyncIterator[client.CoreV1Api]:
    assert real.plane is not None
    async with await kube.api_client(real.plane.kubeconfig) as api:
        yield client.CoreV1Api(api)


def kubectl(real: RealCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert real.plane is not None
    return subprocess.run(
        [str(real.plane.binaries.kubectl), "--kubeconfig", str(real.plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def web_pod(name: str, node: str) -> dict[str, Any]:
    """busybox's httpd on PORT (the stand-in image is busybox), serving hello.txt."""
    script = (
        'busybox mkdir -p /tmp/www && echo "served by $HOSTNAME" > /tmp/www/hello.txt && '
        f"exec busybox httpd -f -p {PORT} -h /tmp/www"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "web",
                    "image": "nvidia/cuda:9.0-devel",
                    "command": ["sh", "-c", script],
                    "ports": [{"containerPort": PORT}],
                }
            ],
        },
    }


async def running(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        pod = await read_pod(core, name)
        phase = pod["status"].get("phase")
        assert phase != "Failed", f"{name} failed: {pod['status']}"
        return pod if phase == "Running" and pod["status"].get("podIP") else None

    return await eventually(probe, timeout_s=90, what=f"{name} Running")


async def proxied(real: RealCluster, pod: str, path: str) -> str:
    """What `kubectl get --raw .../pods/POD:PORT/proxy/PATH` returns, once the server is up:
    kube-apiserver dials the pod's IP itself."""
    raw = f"/api/v1/namespaces/default/pods/{pod}:{PORT}/proxy/{path}"

    async def attempt() -> str | None:
        result = await asyncio.to_thread(kubectl, real, "get", "--raw", raw)
        return result.stdout if result.returncode == 0 else None

    return await eventually(attempt, timeout_s=30, what=f"kubectl get --raw {raw}")


def host_route(subnet: str) -> str:
    return subprocess.run(
        ["ip", "-4", "route", "show", "exact", subnet],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def namespace_ip_forward(node: RealNode) -> str:
    """net.ipv4.ip_forward inside the node's network namespace."""
    holder = json.loads((node.directory / "node.json").read_text())["pids"][HOLDER]
    result = subprocess.run(
        ["nsenter", "-t", str(holder), "-n", "--", "cat", "/proc/sys/net/ipv4/ip_forward"],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


async def test_the_apiserver_reaches_pods_on_every_node_each_in_a_subnet_of_its_own(
    real: RealCluster, core: client.CoreV1Api
) -> None:
    forward_before = host_ip_forward()
    assert real.network is not None
    first, second = (real.nodes[name] for name in NODES)
    assert first.pod_subnet is not None
    assert second.pod_subnet is not None
    assert first.pod_subnet != second.pod_subnet
    for node in (first, second):
        assert node.pod_subnet is not None
        route = host_route(node.pod_subnet)
        assert f"via {node.address} dev {real.network.bridge}" in route
        assert namespace_ip_forward(node) == "1"

    for name, node in (("web-1", first), ("web-2", second)):
        await create_pod(core, web_pod(name, node.name))
    pods = {name: await running(core, name) for name in ("web-1", "web-2")}
    ips = {name: pod["status"]["podIP"] for name, pod in pods.items()}
    assert ips["web-1"] != ips["web-2"]
    assert ipaddress.ip_address(ips["web-1"]) in ipaddress.ip_network(first.pod_subnet)
    assert ipaddress.ip_address(ips["web-2"]) in ipaddress.ip_network(second.pod_subnet)

    for name in ("web-1", "web-2"):
        assert await proxied(real, name, "hello.txt") == f"served by {name}\n"
    assert host_ip_forward() == forward_before

    # Stopping a node deletes its route; the other node's stays.
    subnet = second.pod_subnet
    real.nodes.pop(second.name).stop()
    assert host_route(subnet) == ""
    assert host_route(first.pod_subnet) != ""

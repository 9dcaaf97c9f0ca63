"""Each end-to-end test gets a control plane of its own (about 4 s), so what one test's
operator schedules can never land on another test's nodes. `start_operator` runs the operator;
`gpu_node` brings up a fake GPU node the way a real one runs: the kubelet's device manager
(kubelet-devices, in a mount namespace of its own) and our device plugin (fake cards).

Both run on their own identities by default, as an install runs them: the shipped roles are
applied to every plane, the operator gets a token of its ServiceAccount, each node's plugin a
token of its own bound to its Node. A right the roles lack fails the test that needs it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from cluster import refused_rights
from failure_logs import print_logs
from kubernetes_asyncio import client

from gpushare import kube
from gpushare_harness import ControlPlane
from gpushare_harness.crds import install_crds
from gpushare_harness.devicenode import DeviceNode, start_device_node
from gpushare_harness.identities import install_roles
from gpushare_harness.identities import operator_kubeconfig as operator_kubeconfig_for
from gpushare_harness.operator import OperatorProcess


@pytest.fixture
def plane(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    own = ControlPlane(tmp_path / "plane", binaries=control_plane.binaries)
    with own:
        yield own


@pytest_asyncio.fixture
async def api(plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    async with await kube.api_client(plane.kubeconfig) as api_client:
        await install_crds(api_client)
        await install_roles(plane.binaries.kubectl, plane.kubeconfig)
        yield api_client
    # A request cancelled during its TLS handshake (a reflector stopped while it connects)
    # closes its socket only once the loop runs a little longer (aiohttp's advice for a
    # graceful shutdown); else the socket is reported unclosed when it is collected.
    await asyncio.sleep(0.25)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest_asyncio.fixture
async def operator_kubeconfig(plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path) -> Path:
    """The operator's own: a token of its ServiceAccount, bound by the shipped roles."""
    return await operator_kubeconfig_for(core, plane.kubeconfig, tmp_path / "operator.kubeconfig")


@pytest.fixture
def start_operator(
    operator_kubeconfig: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(
        identity: str = "op-1", *, wait_synced: bool = True, webhook_port: int = 0, **env: str
    ) -> OperatorProcess:
        process = OperatorProcess(
            operator_kubeconfig,
            tmp_path / f"{identity}.log",
            identity=identity,
            env=env,
            webhook_port=webhook_port,
        )
        started.append(process)
        return process.start(wait_synced=wait_synced)

    yield start
    for process in started:
        process.stop()
    print_logs(request, started)
    refused_rights(started)


@pytest_asyncio.fixture
async def gpu_node(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., object]]:
    nodes: list[DeviceNode] = []

    async def start(
        name: str,
        cards: str,
        *,
        plugin_args: list[str] | None = None,
        plugin_env: dict[str, str] | None = None,
        wait_registered: bool = True,
        kubeconfig: Path | None = None,
        unit_mib: int | None = 1,
    ) -> DeviceNode:
        """Node `name` with fake `cards` (e.g. "8x11178"), its kubelet and its plugin; waits
        until the plugin has registered both resources. `kubeconfig`: the plugin's (default
        a token of its ServiceAccount bound to the node). `unit_mib`: the plugin's
        GPU_MEMORY_FACTOR; Volcano's 1 MiB by default, so that these tests, which install no
        admission webhook, write limits in units as Volcano's users do; None: the plugin's
        own default (the cluster unit)."""
        if unit_mib is not None:
            plugin_env = {"GPU_MEMORY_FACTOR": str(unit_mib), **(plugin_env or {})}
        node = await start_device_node(
            core,
            plane.kubeconfig,
            name,
            cards,
            tmp_path,
            plugin_kubeconfig=kubeconfig,
            plugin_args=plugin_args,
            plugin_env=plugin_env,
            wait_registered=wait_registered,
        )
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()
    print_logs(request, [process for node in nodes for process in (node.plugin, node.kubelet)])
    refused_rights([node.plugin for node in nodes])

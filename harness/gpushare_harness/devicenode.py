"""A fake GPU node the way a real one runs its devices: the Node object, the kubelet's own
device manager (`kubelet-devices`) and the device plugin as a process, its sockets in a
folder of the node's own. Pods bound there are admitted and get their env; no container
runs."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client

from gpushare_harness import identities
from gpushare_harness.kubelet import KubeletHarness
from gpushare_harness.nodes import FakeGpuNode, create_gpu_node
from gpushare_harness.plugin import PluginProcess


@dataclass
class DeviceNode:
    name: str
    kubelet: KubeletHarness
    plugin: PluginProcess
    folder: Path

    def stop(self) -> None:
        self.plugin.stop()
        self.kubelet.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


async def start_device_node(
    core: client.CoreV1Api,
    kubeconfig: Path,
    name: str,
    cards: str,
    logs: Path,
    *,
    plugin_kubeconfig: Path | None = None,
    plugin_args: list[str] | None = None,
    plugin_env: dict[str, str] | None = None,
    wait_registered: bool = True,
) -> DeviceNode:
    """Node `name` with fake `cards` (e.g. "8x11178"); waits until the plugin has registered
    both resources (unless told not to). Logs go to `logs`/<name>-kubelet.log and -plugin.log.
    `plugin_kubeconfig`: the plugin's (default a token of its ServiceAccount bound to the
    node, as its DaemonSet pod's token is: the roles of manifests/base/rbac must be applied,
    `identities.install_roles`)."""
    await create_gpu_node(core, FakeGpuNode(name=name, gpu_memory=0, gpu_number=0))
    if plugin_kubeconfig is None:
        plugin_kubeconfig = await identities.plugin_kubeconfig(
            core, kubeconfig, name, logs / f"{name}-plugin.kubeconfig"
        )
    # Short: a unix socket path has at most 107 bytes, and pytest's tmp_path is long.
    folder = Path(tempfile.mkdtemp(prefix=f"dp-{name[:20]}-"))
    plugin_dir = folder / "device-plugins"  # its kubelet's pod-resources socket beside it
    kubelet = KubeletHarness(
        node=name, kubeconfig=kubeconfig, plugin_dir=plugin_dir, log=logs / f"{name}-kubelet.log"
    )
    plugin = PluginProcess(
        node=name,
        kubeconfig=plugin_kubeconfig,
        socket_dir=plugin_dir,
        fake_gpus=cards,
        log=logs / f"{name}-plugin.log",
        args=plugin_args,
        env=plugin_env,
    )
    node = DeviceNode(name, kubelet, plugin, folder)
    try:
        kubelet.start()
        plugin.start(wait_registered=wait_registered)
    except BaseException:
        node.stop()
        raise
    return node

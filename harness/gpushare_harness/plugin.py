"""The device plugin as a real process (`python -m gpushare_plugin`) for a fake node: fake
cards from a spec, sockets in the fake node's own device-plugins folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpushare_harness.process import LoggedProcess


def pod_resources_socket(plugin_dir: Path) -> Path:
    """Where the kubelet whose device-plugins folder is `plugin_dir` serves its pod-resources
    API (a real kubelet: /var/lib/kubelet/pod-resources; `kubelet-devices` the same beside
    its node's folder; absent beside a stand-in kubelet: the plugin then says so every 10 s at
    most and identifies no pod)."""
    return plugin_dir.parent / "pod-resources" / "kubelet.sock"


class PluginProcess(LoggedProcess):
    name = "device-plugin"

    def __init__(
        self,
        *,
        node: str,
        kubeconfig: Path,
        socket_dir: Path,
        fake_gpus: str,
        log: Path,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        detached: bool = False,
    ) -> None:
        super().__init__(log, detached=detached)
        self.node = node
        self.kubeconfig = kubeconfig
        self.socket_dir = socket_dir
        self.fake_gpus = fake_gpus
        self.args = args or []
        self.env = env or {}

    def start(self, *, wait_registered: bool = True, timeout_s: float = 30) -> PluginProcess:
        env = {
            **os.environ,
            "NODE_NAME": self.node,
            "KUBECONFIG": str(self.kubeconfig),
            "GPUSHARE_SOCKET_DIR": str(self.socket_dir),
            "GPUSHARE_POD_RESOURCES_SOCKET": str(pod_resources_socket(self.socket_dir)),
            "GPUSHARE_FAKE_GPUS": self.fake_gpus,
            "GPUSHARE_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        self._spawn([sys.executable, "-m", "gpushare_plugin", *self.args], env)
        if wait_registered:
            self.wait_registered(timeout_s=timeout_s)
        return self

    def wait_registered(self, *, timeout_s: float = 30, after: int | None = None) -> None:
        """Until both resources are registered with the kubelet (since the last start)."""
        first = self.log_start if after is None else after
        for resource in ("volcano.sh/gpu-memory", "volcano.sh/gpu-number"):
            self.wait_logged(
                "registered with the kubelet",
                timeout_s=timeout_s,
                after=first,
                match=lambda line, r=resource: line.get("resource") == r,  # type: ignore[misc]
            )

"""The kubelet of a fake node: `kubelet-devices` (harness/go/kubeletdevices), which runs the
kubelet's own device-manager code, started in a private mount namespace.

The device manager serves kubelet.sock at the kubelet's fixed path,
/var/lib/kubelet/device-plugins/. Each fake node gets its own folder bound over that path in
a namespace of its own (`unshare --mount`, which needs root, as a kubelet does), so several
nodes run side by side on one machine while the device plugin, outside, is pointed at the
folder with --socket-dir. Its pod-resources API is served beside that folder, as a real
kubelet's is beside /var/lib/kubelet/device-plugins (`plugin.pod_resources_socket`): each
node's folder needs a parent of its own. Restarting it is a kubelet restart: the new manager
deletes the plugin sockets and serves a new kubelet.sock, exactly as on a real node.

Its stdout is JSON lines: `capacity` (copied to the Node's status), `started` (a container's
env and device ids from the kubelet's run options), `rejected` (Allocate failed; the pod is
marked Failed with UnexpectedAdmissionError), `deleted`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.plugin import pod_resources_socket
from gpushare_harness.process import LoggedProcess

KUBELET_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


class KubeletUnavailable(RuntimeError):
    """The machine cannot give a fake kubelet its own mount namespace."""


def check_namespaces() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise KubeletUnavailable(
            "the kubelet device-manager harness needs root and util-linux `unshare` (a private "
            "mount namespace per fake node); run the tests as root, as CI does"
        )


class KubeletHarness(LoggedProcess):
    name = "kubelet-devices"

    def __init__(
        self, *, node: str, kubeconfig: Path, plugin_dir: Path, log: Path, detached: bool = False
    ) -> None:
        super().__init__(log, detached=detached)
        self.node = node
        self.kubeconfig = kubeconfig
        self.plugin_dir = plugin_dir
        self.stderr = log.with_suffix(".stderr")

    def start(self) -> KubeletHarness:
        check_namespaces()
        binary = ensure_binaries().kubelet_devices
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        KUBELET_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        script = (
            f'mount --bind "$1" {KUBELET_PLUGIN_DIR} && exec "$2" --node "$3" --kubeconfig "$4" '
            f'--pod-resources-socket "$5"'
        )
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "kubelet-devices",
            str(self.plugin_dir),
            str(binary),
            self.node,
            str(self.kubeconfig),
            str(pod_resources_socket(self.plugin_dir)),
        ]
        self._spawn(argv, dict(os.environ), stderr=self.stderr)
        return self

    def restart(self) -> KubeletHarness:
        """A kubelet restart: stop, then a new device manager on the same folder."""
        self.stop()
        return self.start()

    def started(self, pod: str, container: str | None = None) -> list[dict[str, Any]]:
        """`started` lines of `pod` ("namespace/name"), of one container if given."""
        return [
            line
            for line in self.log_events()
            if line.get("event") == "started"
            and line.get("pod") == pod
            and (container is None or line.get("container") == container)
        ]

    def wait_started(self, pod: str, container: str, *, timeout_s: float = 20) -> dict[str, Any]:
        return self.wait_logged(
            "started",
            timeout_s=timeout_s,
            after=0,
            match=lambda line: line.get("pod") == pod and line.get("container") == container,
        )

    def wait_rejected(self, pod: str, *, timeout_s: float = 20) -> dict[str, Any]:
        return self.wait_logged(
            "rejected", timeout_s=timeout_s, after=0, match=lambda line: line.get("pod") == pod
        )

    def wait_capacity(
        self, resource: str, value: str, *, timeout_s: float = 20, allocatable: bool = False
    ) -> dict[str, Any]:
        key = f"allocatable/{resource}" if allocatable else resource
        return self.wait_logged(
            "capacity",
            timeout_s=timeout_s,
            after=0 if allocatable else None,
            match=lambda line: (line.get("capacity") or {}).get(key) == value,
        )

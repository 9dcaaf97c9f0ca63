"""A real Kubernetes node on this machine: the kubelet built from the pinned module, Debian's
containerd and runc, CNI's bridge plugin, each node in network and mount namespaces of its own.

How one node is laid out (`directory` holds all of its state):
- A holder process (`unshare --mount --net`) keeps the two namespaces alive. In its mount
  namespace it binds files with the values the kubelet insists on over three kernel tunables
  (so the kubelet never rewrites the machine's), binds the node's own folders over
  /var/lib/kubelet (whose device-plugins folder is fixed), /run and /var/log, an empty
  resolv.conf over /etc/resolv.conf (nothing in the node asks the machine's resolver), and a
  sysfs of its own network namespace over /sys/class/net. The namespace forwards (its own
  ip_forward; the machine's stays as it is).
- A veth pair joins the namespace to the cluster's bridge (`gpushare_harness.network`); the
  node's end gets its InternalIP. The node's pods get a /24 of their own (`pod_subnet`),
  which the host routes via that InternalIP, so kube-apiserver reaches them (webhooks,
  `pods/NAME:PORT/proxy`). The namespace has no default route: pods reach only the pods of
  their node, the node and the control plane.
- containerd, the kubelet and kube-proxy run inside both namespaces (`nsenter`), with the
  node's own containerd socket, root and state; pods are bridge-networked by CNI, with the
  node as their gateway (masqueraded, inside the node's namespace only), and reach Services,
  the `kubernetes` one included, through kube-proxy's iptables rules in that namespace.
- The kubelet authenticates as `system:node:<name>` with a certificate of the cluster CA, and
  serves with one for its InternalIP; it accepts only client certificates of that CA and
  webhook-authorized users (no anonymous access).
- Images come from `gpushare_harness.images`, imported with `ctr`; nothing is pulled.

A node's configuration files are rendered by `gpushare_harness.nodeconfig`; its teardown
(`stop`, and `sweep` of the nodes crashed runs left, which every start calls first) is in
`gpushare_harness.nodeteardown`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpushare_harness.binaries import Binaries
from gpushare_harness.controlplane import ControlPlane
from gpushare_harness.images import node_images
from gpushare_harness.network import ClusterNetwork, ip
from gpushare_harness.nodeconfig import CNI_BIN, containerd_socket, write_node_files
from gpushare_harness.nodeteardown import (
    CGROUPS,
    CONTAINERD,
    HOLDER,
    HOLDER_MARK,
    KUBE_PROXY,
    KUBELET,
    cleanup,
    record,
    sweep,
)
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.process import LoggedProcess

_TUNABLES = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
_PACKAGES = {
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
}
# The holder: private mounts, the node's folders and tunables bound in, then it waits.
_HOLDER_SCRIPT = rf"""
set -eu
dir=$1
for t in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
  mount --bind "$dir/sysctl/$(basename $t)" "/proc/sys/$t"
done
mount --bind "$dir/kubelet" /var/lib/kubelet
mount --bind "$dir/run" /run
mount --bind "$dir/log" /var/log
mount --bind "$dir/resolv.conf" /etc/resolv.conf
mount -t sysfs sysfs "$dir/sysfs"
mount --bind "$dir/sysfs/class/net" /sys/class/net
ip link set lo up
echo 1 > /proc/sys/net/ipv4/ip_forward  # this namespace's: kube-apiserver -> the pods
touch "$dir/holder.ready"
exec {HOLDER_MARK}
"""

# A unix socket's path has at most 107 bytes; the plugin dials the node's kubelet.sock.
_MAX_SOCKET_PATH = 100


class RealNodeError(RuntimeError):
    """The node cannot start; the message says what failed and how to fix it."""


def check_prerequisites() -> None:
    """Root, the packages, the CNI plugins: a clear message naming the fix otherwise."""
    if os.geteuid() != 0:
        raise RealNodeError("a real node needs root (namespaces, mounts, containerd, runc)")
    missing = sorted({pkg for tool, pkg in _PACKAGES.items() if shutil.which(tool) is None})
    if not (CNI_BIN / "bridge").is_file():
        missing.append("containernetworking-plugins")
    if missing:
        raise RealNodeError(
            f"missing packages for a real node: {' '.join(missing)} "
            f"(run `make node-packages`, or apt-get install {' '.join(missing)})"
        )
    if not (CGROUPS / "pids").is_dir() and not (CGROUPS / "cgroup.controllers").is_file():
        raise RealNodeError(f"no cgroup hierarchy under {CGROUPS}: the kubelet needs one")


class RealNode:
    """One real node named `name`, the `index`-th on `plane`'s network."""

    def __init__(
        self,
        *,
        name: str,
        index: int,
        plane: ControlPlane,
        network: ClusterNetwork,
        directory: Path,
        detached: bool = False,
        kubelet_config: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.address = network.node_address(index)
        self.pod_subnet: str | None = None  # the node's pods' /24, routed to it once started
        self.plane = plane
        self.network = network
        self.directory = directory
        self.detached = detached
        self.kubelet_config = kubelet_config or {}
        self.binaries: Binaries = plane.binaries
        self._holder = LoggedProcess(directory / "holder.log", detached=detached)
        self._containerd = LoggedProcess(directory / "containerd.log", detached=detached)
        self.kubelet = LoggedProcess(directory / "kubelet.log", detached=detached)
        self._kube_proxy = LoggedProcess(directory / "kube-proxy.log", detached=detached)
        self.kubelet.name = KUBELET
        self._kube_proxy.name = KUBE_PROXY
        self._containerd.name = CONTAINERD
        self._holder.name = HOLDER

    # -- paths -----------------------------------------------------------------------------

    @property
    def plugin_dir(self) -> Path:
        """The node's /var/lib/kubelet/device-plugins, as seen from the host."""
        return self.directory / "kubelet" / "device-plugins"

    @property
    def checkpoint(self) -> Path:
        """The kubelet device manager's checkpoint (which pod holds which device ids)."""
        return self.plugin_dir / "kubelet_internal_checkpoint"

    @property
    def containerd_socket(self) -> Path:
        return containerd_socket(self.directory)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, timeout_s: float = 120) -> RealNode:
        check_prerequisites()
        longest = self.plugin_dir / "kubelet.sock"
        if len(str(longest)) > _MAX_SOCKET_PATH:
            raise RealNodeError(
                f"{longest} is longer than a unix socket path may be: give node {self.name} a "
                "shorter folder"
            )
        sweep()
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        try:
            self._start_holder()
            self._record()
            self._join_network()
            self._route_pods()
            self._write_configs()
            self._start_containerd()
            self._import_images()
            self.start_kubelet(timeout_s=timeout_s)
            self._start_kube_proxy()
        except BaseException:
            self.stop()
            raise
        return self

    def start_kubelet(self, *, timeout_s: float = 120) -> None:
        """Start the kubelet and wait until its Node is Ready."""
        argv = [
            *self._enter(),
            str(self.binaries.kubelet),
            f"--config={self.directory / 'kubelet.yaml'}",
            f"--kubeconfig={self.directory / 'kubelet.kubeconfig'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            "--v=1",
        ]
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        self.kubelet._spawn(argv, dict(os.environ))
        self._record()
        self.wait_ready(timeout_s=timeout_s, since=since)

    def stop_kubelet(self) -> None:
        self.kubelet.stop()

    def restart_kubelet(self, *, timeout_s: float = 120) -> None:
        """A kubelet restart: running pods keep running, the device manager restores its
        checkpoint and device plugins must register again."""
        self.stop_kubelet()
        self.start_kubelet(timeout_s=timeout_s)

    def stop(self) -> None:
        cleanup(self.directory)
        for process in (self._kube_proxy, self.kubelet, self._containerd, self._holder):
            process.stop()  # ended by `cleanup`: only reaped here

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_ready(
        self, *, timeout_s: float = 120, since: datetime.datetime | None = None
    ) -> dict[str, Any]:
        """The Node once Ready, by a heartbeat of this kubelet (at or after `since`)."""
        deadline = time.monotonic() + timeout_s
        last: object = "no Node yet"
        while time.monotonic() < deadline:
            if not self.kubelet.running:
                raise RealNodeError(f"the kubelet of {self.name} exited:\n{self.kubelet.tail()}")
            try:
                node = self.plane_get(f"/api/v1/nodes/{self.name}")
                conditions = {c["type"]: c for c in node["status"].get("conditions", [])}
                ready = conditions.get("Ready", {})
                beat = datetime.datetime.fromisoformat(
                    ready.get("lastHeartbeatTime", "1970-01-01T00:00:00Z")
                )
                if ready.get("status") == "True" and (since is None or beat >= since):
                    return node
                last = ready.get("message") or ready
            except urllib.error.HTTPError as error:  # 404 until the kubelet registers
                error.close()
                last = error
            except (urllib.error.URLError, OSError, KeyError, ValueError) as error:
                last = error
            time.sleep(0.5)
        raise RealNodeError(
            f"node {self.name} not Ready after {timeout_s:.0f} s ({last}):\n{self.kubelet.tail()}"
        )

    def plane_get(self, path: str) -> dict[str, Any]:
        """GET `path` from the apiserver as the admin."""
        assert self.plane.pki is not None
        assert self.plane.endpoints is not None
        context = ssl.create_default_context(cafile=str(self.plane.pki.ca_cert))
        context.load_cert_chain(str(self.plane.pki.admin_cert), str(self.plane.pki.admin_key))
        url = f"{self.plane.endpoints.server}{path}"
        with urllib.request.urlopen(url, context=context, timeout=10) as answer:  # noqa: S310
            found: dict[str, Any] = json.loads(answer.read())
            return found

    def device_plugin(
        self,
        cards: str,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> PluginProcess:
        """The gpushare device plugin for this node on fake `cards` (not started): it runs on
        the host and dials the node's kubelet.sock through the node's folder. `kubeconfig`:
        its own (`identities.plugin_kubeconfig`); default the admin's."""
        return PluginProcess(
            node=self.name,
            kubeconfig=kubeconfig or self.plane.kubeconfig,
            socket_dir=self.plugin_dir,
            fake_gpus=cards,
            log=log,
            env=env,
            detached=self.detached,
        )

    def ctr(self, *args: str) -> str:
        """`ctr` against this node's containerd (namespace k8s.io)."""
        result = subprocess.run(
            [
                str(self.binaries.ctr),
                "--address",
                str(self.containerd_socket),
                "-n",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} on {self.name}: {result.stderr.strip()}")
        return result.stdout

    # -- steps -------------------------------------------------------------------------------

    def _enter(self) -> list[str]:
        return ["nsenter", "-t", str(self._holder.pid), "-m", "-n", "--"]

    def _start_holder(self) -> None:
        folders = (
            "kubelet/device-plugins",
            "run",
            "log",
            "sysfs",
            "sysctl",
            "cni",
            "cdi",
            "containerd",
        )
        for folder in folders:
            (self.directory / folder).mkdir(parents=True, exist_ok=True)
        for tunable, value in _TUNABLES.items():
            (self.directory / "sysctl" / Path(tunable).name).write_text(f"{value}\n")
        (self.directory / "resolv.conf").write_text("# no nameserver: nothing resolves here\n")
        Path("/var/lib/kubelet").mkdir(parents=True, exist_ok=True)  # the mount point
        argv = [
            "unshare", "--mount", "--net", "--propagation", "private",
            "sh", "-c", _HOLDER_SCRIPT, "holder", str(self.directory),
        ]  # fmt: skip
        self._holder._spawn(argv, dict(os.environ))
        deadline = time.monotonic() + 10
        while not (self.directory / "holder.ready").exists():
            if not self._holder.running or time.monotonic() > deadline:
                raise RealNodeError(
                    f"the namespaces of {self.name} could not be set up:\n{self._holder.tail()}"
                )
            time.sleep(0.05)

    def _join_network(self) -> None:
        host_end = f"gsn-{self.directory.name[-6:]}-{self._holder.pid % 10000}"[:15]
        ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0",
           "netns", str(self._holder.pid))  # fmt: skip
        for args, netns in (
            (("link", "set", host_end, "addrgenmode", "none"), None),
            (("link", "set", host_end, "master", self.network.bridge), None),
            (("link", "set", host_end, "up"), None),
            (("link", "set", "eth0", "addrgenmode", "none"), self._holder.pid),
            (("addr", "add", f"{self.address}/{self.network.prefix}", "dev", "eth0"),
             self._holder.pid),
            (("link", "set", "eth0", "up"), self._holder.pid),
        ):  # fmt: skip
            ip(*args, netns_pid=netns)

    def _route_pods(self) -> None:
        """A /24 of its own for the node's pods, routed to it from the host (and recorded
        for `cleanup`, which deletes the route)."""
        self.pod_subnet = str(self.network.add_pod_route(self.address))
        self._record()

    def _write_configs(self) -> None:
        assert self.pod_subnet is not None
        write_node_files(
            self.directory,
            name=self.name,
            address=self.address,
            pod_subnet=self.pod_subnet,
            plane=self.plane,
            sandbox_image=node_images(self.binaries)[0].name,
            kubelet_overrides=self.kubelet_config,
        )

    def _start_containerd(self) -> None:
        config = str(self.directory / "containerd.toml")
        argv = [*self._enter(), str(self.binaries.containerd), "--config", config]
        # Its shim is found on PATH: the one built beside it, not a packaged older one.
        shims = f"{self.binaries.containerd_shim_runc_v2.parent}:{os.environ.get('PATH', '')}"
        self._containerd._spawn(argv, {**os.environ, "PATH": shims})
        self._record()
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(RealNodeError):
                self.ctr("version")
                return
            if not self._containerd.running or time.monotonic() > deadline:
                raise RealNodeError(
                    f"containerd of {self.name} did not start:\n{self._containerd.tail()}"
                )
            time.sleep(0.2)

    def _import_images(self) -> None:
        for image in node_images(self.binaries):
            self.import_image(image.archive)

    def import_image(self, archive: Path) -> None:
        """An OCI archive into the node's containerd, as `ctr images import` does."""
        self.ctr("images", "import", "--no-unpack", str(archive))

    def _start_kube_proxy(self) -> None:
        argv = [
            *self._enter(),
            str(self.binaries.kube_proxy),
            f"--config={self.directory / 'kube-proxy.yaml'}",
            "--v=1",
        ]
        self._kube_proxy._spawn(argv, dict(os.environ))
        self._record()
        deadline = time.monotonic() + 60
        while not self._kubernetes_service_routed():
            if not self._kube_proxy.running or time.monotonic() > deadline:
                raise RealNodeError(
                    f"kube-proxy of {self.name} did not route the kubernetes Service:\n"
                    f"{self._kube_proxy.tail()}"
                )
            time.sleep(0.5)

    def _kubernetes_service_routed(self) -> bool:
        """kube-proxy's rules in the node's namespace carry the `kubernetes` Service."""
        rules = subprocess.run(
            [*self._enter(), "iptables-save", "-t", "nat"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return "default/kubernetes:https" in rules.stdout

    def pids(self) -> dict[str, int]:
        """The node's own processes that run, by name (the namespace holder, containerd, the
        kubelet, kube-proxy)."""
        return {
            proc.name: proc.pid
            for proc in (self._holder, self._containerd, self.kubelet, self._kube_proxy)
            if proc.running
        }

    def _record(self) -> None:
        """The pids and paths `cleanup` needs, beside the node and in the registry."""
        pids = self.pids()
        route = None
        if self.pod_subnet is not None:
            route = {"subnet": self.pod_subnet, "via": self.address, "dev": self.network.bridge}
        record(self.name, self.directory, holder=self._holder.pid, pids=pids, pod_route=route)


class RealCluster:
    """A whole cluster with real nodes: the bridge, a control plane with controllers
    listening on it (state in `directory`), and the nodes added to it. `stop()` removes all
    of it; `stop_recorded_nodes` removes the nodes from what `describe()` returned, in another
    process."""

    def __init__(
        self, directory: Path, *, binaries: Binaries | None = None, detached: bool = False
    ) -> None:
        self.directory = directory
        self.binaries = binaries
        self.detached = detached
        self.network: ClusterNetwork | None = None
        self.plane: ControlPlane | None = None
        self.nodes: dict[str, RealNode] = {}

    def start(self) -> RealCluster:
        self.network = ClusterNetwork.create()
        try:
            self.plane = ControlPlane(
                self.directory,
                binaries=self.binaries,
                die_with_parent=not self.detached,
                controllers=True,
                address=self.network.address,
            ).start()
            self.network.adopt(self.plane.pids()["kube-apiserver"])
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, name: str, **options: Any) -> RealNode:
        assert self.plane is not None, "not started"
        assert self.network is not None
        node = RealNode(
            name=name,
            index=len(self.nodes),
            plane=self.plane,
            network=self.network,
            # Short: the plugin dials a unix socket inside it (at most 107 bytes).
            directory=Path(tempfile.mkdtemp(prefix=f"gpushare-{name[:20]}-")),
            detached=self.detached,
            **options,
        )
        self.nodes[name] = node
        return node.start()

    def describe(self) -> dict[str, Any]:
        assert self.plane is not None, "not started"
        assert self.network is not None
        return {
            **self.plane.describe(),
            "network": self.network.to_json(),
            "nodes": {name: str(node.directory) for name, node in self.nodes.items()},
        }

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        if self.plane is not None:
            self.plane.stop()
        if self.network is not None:
            self.network.delete()

    @staticmethod
    def stop_recorded_nodes(state: dict[str, Any]) -> None:
        """Remove the nodes of a cluster `describe()`d in `state`, from another process."""
        for directory in state.get("nodes", {}).values():
            cleanup(Path(directory))

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

"""A real Kubernetes node on this machine: the kubelet built from the pinned module, Debian's
containerd and runc, CNI's bridge plugin, each node in network and mount namespaces of its own.

How one node is laid out (`directory` holds all of its state):
- A holder process (`unshare --mount --net`) keeps the two namespaces alive. In its mount
  namespace it binds files with the values the kubelet insists on over three kernel tunables
  (so the kubelet never rewrites the machine's), binds the node's own folders over
  /var/lib/kubelet (whose device-plugins folder is fixed), /run and /var/log, an empty
  resolv.conf over /etc/resolv.conf (nothing in the node asks the machine's resolver), and a
  sysfs of its own network namespace over /sys/class/net.
- A veth pair joins the namespace to the cluster's bridge (`gpushare_harness.network`); the
  node's end gets its InternalIP. The namespace has no default route: pods reach only each
  other, the node and the control plane.
- containerd and the kubelet run inside both namespaces (`nsenter`), with the node's own
  containerd socket, root and state; pods are bridge-networked by CNI (no gateway, no NAT).
- The kubelet authenticates as `system:node:<name>` with a certificate of the cluster CA, and
  serves with one for its InternalIP; it accepts only client certificates of that CA and
  webhook-authorized users (no anonymous access).
- Images come from `gpushare_harness.images`, imported with `ctr`; nothing is pulled.

Teardown (`stop`, also `cleanup` of a node left by a crashed run: `sweep`) kills the kubelet,
the containers' processes, containerd, its shims (found by the node's own socket path) and the
holder, each by pid, then removes the containers' cgroups and the node's folder. The
namespaces, their mounts, veth and pod bridge vanish with the holder.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpushare_harness.binaries import Binaries, cache_dir
from gpushare_harness.controlplane import ControlPlane, alive
from gpushare_harness.images import node_images
from gpushare_harness.network import ClusterNetwork, ip
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.process import LoggedProcess

CNI_BIN = Path("/usr/lib/cni")
POD_SUBNET = "10.88.0.0/16"  # inside each node's own namespace: nodes never see each other's
_CGROUPS = Path("/sys/fs/cgroup")
_TUNABLES = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
_PACKAGES = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
}
# The holder: private mounts, the node's folders and tunables bound in, then it waits.
_HOLDER_SCRIPT = r"""
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
touch "$dir/holder.ready"
exec sleep infinity
"""


_HOLDER_MARK = "sleep infinity"
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
    if not (_CGROUPS / "pids").is_dir() and not (_CGROUPS / "cgroup.controllers").is_file():
        raise RealNodeError(f"no cgroup hierarchy under {_CGROUPS}: the kubelet needs one")


def registry() -> Path:
    """Where each running real node leaves a pointer to its folder (for `sweep`)."""
    return cache_dir() / "real-nodes"


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
        self.plane = plane
        self.network = network
        self.directory = directory
        self.detached = detached
        self.kubelet_config = kubelet_config or {}
        self.binaries: Binaries = plane.binaries
        self._holder = LoggedProcess(directory / "holder.log", detached=detached)
        self._containerd = LoggedProcess(directory / "containerd.log", detached=detached)
        self.kubelet = LoggedProcess(directory / "kubelet.log", detached=detached)
        self.kubelet.name = "kubelet"
        self._containerd.name = "containerd"
        self._holder.name = "node namespaces"

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
        return self.directory / "containerd" / "containerd.sock"

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
            self._write_configs()
            self._start_containerd()
            self._import_images()
            self.start_kubelet(timeout_s=timeout_s)
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
        for process in (self.kubelet, self._containerd, self._holder):
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
        self, cards: str, log: Path, *, env: dict[str, str] | None = None
    ) -> PluginProcess:
        """The gpushare device plugin for this node on fake `cards` (not started): it runs on
        the host and dials the node's kubelet.sock through the node's folder."""
        return PluginProcess(
            node=self.name,
            kubeconfig=self.plane.kubeconfig,
            socket_dir=self.plugin_dir,
            fake_gpus=cards,
            log=log,
            env=env,
            detached=self.detached,
        )

    def ctr(self, *args: str) -> str:
        """`ctr` against this node's containerd (namespace k8s.io)."""
        result = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
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
        folders = ("kubelet/device-plugins", "run", "log", "sysfs", "sysctl", "cni", "containerd")
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

    def _write_configs(self) -> None:
        assert self.plane.pki is not None
        pki = self.plane.pki
        d = self.directory
        client_cert, client_key = pki.issue(
            d / "kubelet-client", f"system:node:{self.name}", organization="system:nodes"
        )
        serving_cert, serving_key = pki.issue(
            d / "kubelet-serving", self.name, server_ips=[self.address], server_names=[self.name]
        )
        self.plane.write_kubeconfig(
            d / "kubelet.kubeconfig",
            f"system:node:{self.name}",
            {"client-certificate": str(client_cert), "client-key": str(client_key)},
        )
        containerd = d / "containerd"
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        (d / "containerd.toml").write_text(
            "\n".join(
                [
                    "version = 2",
                    f'root = "{containerd / "root"}"',
                    f'state = "{containerd / "state"}"',
                    "disabled_plugins = ["
                    + ", ".join(
                        f'"io.containerd.snapshotter.v1.{name}"'
                        for name in ("aufs", "btrfs", "zfs", "devmapper")
                    )
                    + "]",
                    "[grpc]",
                    f'  address = "{self.containerd_socket}"',
                    "[ttrpc]",
                    f'  address = "{containerd / "containerd.sock.ttrpc"}"',
                    '[plugins."io.containerd.internal.v1.opt"]',
                    f'  path = "{containerd / "opt"}"',
                    f"{cri}]",
                    f'  sandbox_image = "{node_images(self.binaries)[0].name}"',
                    # runc may not lower its own OOM score without CAP_SYS_RESOURCE here.
                    "  restrict_oom_score_adj = true",
                    f"{cri}.containerd]",
                    '  snapshotter = "overlayfs"',
                    '  default_runtime_name = "runc"',
                    f"{cri}.containerd.runtimes.runc]",
                    '  runtime_type = "io.containerd.runc.v2"',
                    f"{cri}.cni]",
                    f'  bin_dir = "{CNI_BIN}"',
                    f'  conf_dir = "{d / "cni"}"',
                    "",
                ]
            )
        )
        (d / "cni" / "10-gpushare.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "gpushare-pods",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            # No gateway, no masquerade: pods reach only the node's pod
                            # network, so nothing of theirs can leave the node.
                            "isGateway": False,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "dataDir": str(d / "cni-ipam"),
                            },
                        },
                        {"type": "loopback"},
                    ],
                },
                indent=2,
            )
        )
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The machines run cgroup v1, which 1.35+ refuses unless told.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            # Refuse to start rather than rewrite kernel tunables (bound in the namespace).
            "protectKernelDefaults": True,
            "failSwapOn": False,
            "address": self.address,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "tlsCertFile": str(serving_cert),
            "tlsPrivateKeyFile": str(serving_key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "resolvConf": str(d / "resolv.conf"),
            "clusterDNS": [],
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            "registerNode": True,
            # Images are imported, never pulled, and never collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "10s",
            "shutdownGracePeriod": "0s",
            **self.kubelet_config,
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _start_containerd(self) -> None:
        argv = [*self._enter(), "containerd", "--config", str(self.directory / "containerd.toml")]
        self._containerd._spawn(argv, dict(os.environ))
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
            self.ctr("images", "import", "--no-unpack", str(image.archive))

    def _record(self) -> None:
        """The pids and paths `cleanup` needs, beside the node and in the registry."""
        pids = {
            proc.name: proc.pid
            for proc in (self._holder, self._containerd, self.kubelet)
            if proc.running
        }
        state = {"name": self.name, "directory": str(self.directory), "pids": pids}
        (self.directory / "node.json").write_text(json.dumps(state, indent=2))
        registry().mkdir(parents=True, exist_ok=True)
        (registry() / f"{self.directory.name}-{self._holder.pid}.json").write_text(
            json.dumps(state)
        )


# -- teardown ----------------------------------------------------------------------------------


def sweep() -> list[str]:
    """Clean up every real node whose holder is gone (a crashed run); their names."""
    cleaned = []
    for entry in sorted(registry().glob("*.json")) if registry().is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads(entry.read_text())
            holder = state["pids"].get("node namespaces")
            if holder is None or not _alive(holder, _HOLDER_MARK):
                cleanup(Path(state["directory"]))  # removes the entry too
                cleaned.append(state["name"])
    return cleaned


def cleanup(directory: Path) -> None:
    """Stop everything of the node in `directory` (running or left by a crash) and remove
    its containers' cgroups and its folder."""
    state_file = directory / "node.json"
    pids: dict[str, int] = (
        json.loads(state_file.read_text())["pids"] if state_file.is_file() else {}
    )
    _end(pids.get("kubelet"), str(directory))
    bundles = directory / "containerd" / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
    ids = sorted(p.name for p in bundles.iterdir()) if bundles.is_dir() else []
    for container in ids:
        with contextlib.suppress(OSError, ValueError):
            _end(int((bundles / container / "init.pid").read_text()), container, cgroup=True)
    _end(pids.get("containerd"), str(directory))
    socket = str(directory / "containerd" / "containerd.sock")
    for pid in _pids_with(socket):  # the shims, started with the node's own socket path
        _end(pid, socket)
    _end(pids.get("node namespaces"), _HOLDER_MARK)
    for container in ids:
        for controller in _CGROUPS.iterdir() if _CGROUPS.is_dir() else []:
            with contextlib.suppress(OSError):
                (controller / "k8s.io" / container).rmdir()
    for controller in _CGROUPS.iterdir() if _CGROUPS.is_dir() else []:
        with contextlib.suppress(OSError):
            (controller / "k8s.io").rmdir()  # only once no node uses it
    shutil.rmtree(directory, ignore_errors=True)
    for entry in registry().glob(f"{directory.name}-*.json") if registry().is_dir() else []:
        entry.unlink(missing_ok=True)


def _alive(pid: int, mark: str) -> bool:
    """`pid` runs and is ours: its command line or cgroup names `mark`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return alive(pid) and (mark in cmdline or mark in cgroup)


def _end(pid: int | None, mark: str, *, cgroup: bool = False) -> None:
    """SIGTERM (SIGKILL for a container's process), then SIGKILL after 10 s; only if `pid`
    is still the process we started."""
    if pid is None or not _alive(pid, mark):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL if cgroup else signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid, mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        if _alive(pid, mark):
            os.kill(pid, signal.SIGKILL)


def _pids_with(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


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

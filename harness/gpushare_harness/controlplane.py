"""etcd and kube-apiserver on free ports, with TLS, Node+RBAC authorization and an admin
kubeconfig; with `controllers=True` also kube-controller-manager and kube-scheduler, all
from the same pinned module.

The flags follow envtest (controller-runtime's test control plane). A plane with controllers
is a whole cluster: the ServiceAccount admission plugin is on (the controller-manager makes
each namespace's default ServiceAccount and its tokens), namespaces are deleted, Deployments
and DaemonSets make pods, the garbage collector follows owner references, and kube-scheduler
places the pods that are not ours. A plane without them (most operator tests: one per test,
about 4 s) keeps the ServiceAccount plugin off, since no default ServiceAccount would ever
appear. TaintNodesByCondition stays off in both: fake nodes never post a heartbeat, and a
real kubelet only registers once it is ready to run pods.

The apiserver listens on one address: loopback, or for planes with real nodes the address of
the bridge those nodes join (`gpushare_harness.network`); the kubelets are dialled at their
InternalIP only, so nothing ever resolves a node's name through the machine's resolver.
Webhooks and aggregated APIs are dialled at their Service's endpoints (pod IPs, which the host
routes to the real nodes), not at its ClusterIP: no kube-proxy runs on the host.

Processes run in their own session so one signal stops each with its children; in tests
they also die with the test process (PR_SET_PDEATHSIG), so a crashed run leaves nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare_harness.binaries import Binaries, ensure_binaries
from gpushare_harness.pki import Pki, write_pki

_START_TIMEOUT_S = 90.0

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service: the first address of the range (the apiserver gives it that)."""


class ControlPlaneError(RuntimeError):
    """The control plane did not start; the message carries the end of its log."""


_CONTROLLERS = ("kube-scheduler", "kube-controller-manager")
# free_port's ports start above the well-known ones the real node binds (kubelet 10250,
# kube-proxy 10249 and 10256).
_LOWEST_FREE_PORT = 20000
# Only Bindings and evictions, once answered: a few hundred bytes per pod placed.
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["pods/binding", "pods/eviction"]}],
        },
        {"level": "None"},
    ],
}


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    apiserver_port: int
    etcd_client_port: int
    etcd_peer_port: int
    address: str = "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def etcd(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"


class ControlPlane:
    """A running etcd + kube-apiserver (+ kube-controller-manager and kube-scheduler) under
    `directory`.

    `start()` blocks until /readyz answers ok (and, with controllers, until the default
    ServiceAccount exists); `stop()` ends them all. `kubeconfig` holds an admin
    (system:masters) client certificate. The apiserver's audit log (`audited`) records every
    Binding and eviction it was asked for, and its answer: who bound a pod, and how often,
    read from the apiserver rather than from the binder's own log. With `profiling`, the
    apiserver serves /debug/pprof (to the admin) and etcd on its client URL (`endpoints.etcd`), for
    benchmarks that show where the server's CPU goes. The apiserver compacts etcd's history
    every `compaction_interval_s` (0: never, for benchmarks, where a compaction would land in
    whichever phase it falls in).
    """

    def __init__(
        self,
        directory: Path,
        *,
        binaries: Binaries | None = None,
        die_with_parent: bool = True,
        controllers: bool = False,
        address: str = "127.0.0.1",
        node_monitor_grace_s: int = 40,
        profiling: bool = False,
        compaction_interval_s: int = 300,
    ) -> None:
        self.directory = directory
        self.binaries = binaries or ensure_binaries()
        self.kubeconfig = directory / "kubeconfig"
        self.audit_log = directory / "audit.log"
        self.controllers = controllers
        self.address = address
        self.node_monitor_grace_s = node_monitor_grace_s
        self.profiling = profiling
        self.compaction_interval_s = compaction_interval_s
        self._die_with_parent = die_with_parent
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._health_ports: dict[str, int] = {}
        self.endpoints: Endpoints | None = None
        self.pki: Pki | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Pods reach the apiserver as the `kubernetes` Service (kube-proxy on real nodes).
        server_ips = sorted({"127.0.0.1", self.address, KUBERNETES_SERVICE_IP})
        self.pki = write_pki(self.directory / "pki", server_ips=server_ips)
        for attempt in range(3):  # a free port can be taken between probing and binding
            self.endpoints = Endpoints(
                apiserver_port=free_port(),
                etcd_client_port=free_port(),
                etcd_peer_port=free_port(),
                address=self.address,
            )
            try:
                self._launch()
                break
            except ControlPlaneError:
                self.stop()
                if attempt == 2:
                    raise
        if self.controllers:
            try:
                self._launch_controllers()
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop the controllers, kube-apiserver, then etcd (SIGTERM, then SIGKILL after
        10 s)."""
        for name in (*_CONTROLLERS, "kube-apiserver", "etcd"):
            process = self._processes.pop(name, None)
            if process is not None:
                _end(process)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM) and start it again on the same port and etcd: every
        client's watches break and its calls fail until it is ready again."""
        _end(self._processes.pop("kube-apiserver"))
        self._spawn("kube-apiserver", self._argv["kube-apiserver"])
        self._wait_ready()

    def audited(self, subresource: str) -> list[dict[str, Any]]:
        """The audit events of the requests for pods' `subresource` ("binding", "eviction"),
        oldest first: `objectRef` (the pod), `user`, `responseStatus.code`, the times."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]
        return [e for e in events if e.get("objectRef", {}).get("subresource") == subresource]

    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self._processes.items()}

    # -- internals -----------------------------------------------------------------------

    def _launch(self) -> None:
        assert self.endpoints is not None
        assert self.pki is not None
        ports = self.endpoints
        etcd_data = self.directory / "etcd"
        etcd_client = ports.etcd
        etcd_peer = f"http://127.0.0.1:{ports.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                f"--data-dir={etcd_data}",
                f"--listen-client-urls={etcd_client}",
                f"--advertise-client-urls={etcd_client}",
                f"--listen-peer-urls={etcd_peer}",
                f"--initial-advertise-peer-urls={etcd_peer}",
                f"--initial-cluster=default={etcd_peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                f"--enable-pprof={str(self.profiling).lower()}",
            ],
        )
        pki = self.pki
        audit_policy = self.directory / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(_AUDIT_POLICY))
        disabled = (
            "TaintNodesByCondition" if self.controllers else "ServiceAccount,TaintNodesByCondition"
        )
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={etcd_client}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={ports.apiserver_port}",
                f"--cert-dir={self.directory / 'pki'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                f"--service-account-issuer={ports.server}",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--disable-admission-plugins={disabled}",
                "--allow-privileged=true",
                # Kubelets are dialled at their InternalIP only: their names are resolved
                # nowhere, so no DNS query leaves the machine for exec or logs.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki.kubelet_client_cert}",
                f"--kubelet-client-key={pki.kubelet_client_key}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                # No kube-proxy on the host: dial a Service's endpoints (pods), not its ClusterIP.
                "--enable-aggregator-routing=true",
                f"--profiling={str(self.profiling).lower()}",
                f"--etcd-compaction-interval={self.compaction_interval_s}s",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
            ],
        )
        self._wait_ready()
        self._write_kubeconfig()

    def _launch_controllers(self) -> None:
        assert self.pki is not None
        pki = self.pki
        kubeconfig = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--profiling=false",
        ]
        for name in _CONTROLLERS:
            self._health_ports[name] = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                *kubeconfig,
                f"--secure-port={self._health_ports['kube-controller-manager']}",
                f"--cert-dir={self.directory / 'kube-controller-manager'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--node-monitor-grace-period={self.node_monitor_grace_s}s",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                *kubeconfig,
                f"--secure-port={self._health_ports['kube-scheduler']}",
                f"--cert-dir={self.directory / 'kube-scheduler'}",
            ],
        )
        self._wait_controllers()

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._argv[name] = argv
        log = (self.directory / f"{name}.log").open("ab")
        self._processes[name] = subprocess.Popen(
            dying_with_parent(argv) if self._die_with_parent else argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def _poll(self, what: str, url: str, context: ssl.SSLContext, log: str) -> None:
        """Until `url` answers 200 (ControlPlaneError with `log`'s tail otherwise)."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                # https to our own apiserver and controllers only.
                with urllib.request.urlopen(url, context=context, timeout=5) as answer:  # noqa: S310
                    if answer.status == 200:
                        return
            except urllib.error.HTTPError as error:  # e.g. 404 until the object exists
                error.close()
                last_error = str(error)
            except (urllib.error.URLError, OSError) as error:
                last_error = str(error)
            time.sleep(0.25)
        raise ControlPlaneError(
            f"{what} not ready after {_START_TIMEOUT_S:.0f} s ({last_error}):\n{self.log_tail(log)}"
        )

    def _wait_ready(self) -> None:
        assert self.endpoints is not None
        self._poll(
            "kube-apiserver",
            f"{self.endpoints.server}/readyz",
            self._ssl_context(),
            "kube-apiserver",
        )

    def _wait_controllers(self) -> None:
        """Both healthy, and the default ServiceAccount made: pods can be created."""
        assert self.endpoints is not None
        # Their serving certificates are self-signed in their --cert-dir: only /healthz of
        # our own processes on loopback is read without verifying them.
        local = ssl._create_unverified_context()  # noqa: S323
        for name, port in self._health_ports.items():
            self._poll(name, f"https://127.0.0.1:{port}/healthz", local, name)
        self._poll(
            "the default ServiceAccount",
            f"{self.endpoints.server}/api/v1/namespaces/default/serviceaccounts/default",
            self._ssl_context(),
            "kube-controller-manager",
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.directory / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None
        user = {
            "client-certificate": str(self.pki.admin_cert),
            "client-key": str(self.pki.admin_key),
        }
        self.write_kubeconfig(self.kubeconfig, "gpushare-admin", user)

    def token_kubeconfig(self, path: Path, name: str, token: str) -> Path:
        """A kubeconfig at `path` that authenticates with a bearer `token` (a service
        account's, from the TokenRequest API)."""
        self.write_kubeconfig(path, name, {"token": token})
        return path

    def write_kubeconfig(self, path: Path, user_name: str, user: dict[str, str]) -> None:
        assert self.endpoints is not None
        assert self.pki is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpushare-local",
                    "cluster": {
                        "server": self.endpoints.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user_name, "user": user}],
            "contexts": [
                {
                    "name": "gpushare-local",
                    "context": {
                        "cluster": "gpushare-local",
                        "user": user_name,
                    },
                }
            ],
            "current-context": "gpushare-local",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))

    def describe(self) -> dict[str, object]:
        """What a person needs to reach it (printed by `gpushare-dev up`)."""
        assert self.endpoints is not None
        return {
            "server": self.endpoints.server,
            "kubeconfig": str(self.kubeconfig),
            "address": self.address,
            "pids": self.pids(),
            "directory": str(self.directory),
        }

    def to_json(self) -> str:
        return json.dumps(self.describe(), indent=2)


def _end(process: subprocess.Popen[bytes]) -> None:
    terminate(process.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    if process.poll() is None:
        process.kill()
        process.wait()


def terminate(pid: int, signal_number: int = signal.SIGTERM) -> None:
    """Signal the process group led by `pid`, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_number)


def alive(pid: int) -> bool:
    """Running, and not a zombie left for a parent that does not reap (PID 1 in containers)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def free_port() -> int:
    """A loopback port nothing listens on and not handed out before, below the kernel's
    ephemeral range. A port the kernel picks (bind to 0) comes from that range, where any
    outgoing connection's source port can take it before the process it was meant for binds
    it: kube-controller-manager failed so in CI ("address already in use")."""
    ephemeral_low = _ephemeral_range()[0]
    if ephemeral_low - _LOWEST_FREE_PORT >= 1024:
        for _ in range(100):
            port = _LOWEST_FREE_PORT + secrets.randbelow(ephemeral_low - _LOWEST_FREE_PORT)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:  # listened on
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # an unusual range
        probe.bind(("127.0.0.1", 0))
        kernel_port: int = probe.getsockname()[1]
        return kernel_port


_handed_out: set[int] = set()
"""Ports `free_port` gave: two asked for before either is bound must differ."""


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's source ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when the thread that started it dies (no orphans
    after a crash). util-linux's setpriv sets that and execs `argv` (same pid): no Python
    runs between fork and exec, so Popen can vfork, and no pthread_atfork handler runs in the
    child. gRPC's does when a parent with gRPC threads forks, and it restarted a poller that
    then aborted the child on a descriptor closed before exec."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]

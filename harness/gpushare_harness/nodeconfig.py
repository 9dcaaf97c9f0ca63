"""The configuration files of a real node (`gpushare_harness.realnode`), all inside the node's
folder `directory`: containerd's config, the CNI conflist of the pod network, the kubelet's
and kube-proxy's configs, rendered as text by pure functions, and the one function that
writes them with the certificates and kubeconfigs of the kubelet and kube-proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpushare_harness.controlplane import ControlPlane

CNI_BIN = Path("/usr/lib/cni")


def containerd_socket(directory: Path) -> Path:
    """The node's own containerd socket (its shims carry the path on their command line)."""
    return directory / "containerd" / "containerd.sock"


def containerd_state(directory: Path) -> Path:
    """containerd's state folder: its tasks' bundles, one per running container."""
    return directory / "containerd" / "state"


def cdi_spec_dir(directory: Path) -> Path:
    """Where the node's containerd reads CDI specs (the fake cards' devices, say)."""
    return directory / "cdi"


def containerd_config(directory: Path, *, sandbox_image: str) -> str:
    """containerd.toml (version 2, which containerd 2 takes as it is): the node's own socket,
    root and state; pods bridge-networked by CNI; CDI devices from the node's spec folder."""
    containerd = directory / "containerd"
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f'root = "{containerd / "root"}"',
            f'state = "{containerd_state(directory)}"',
            "disabled_plugins = ["
            + ", ".join(
                f'"io.containerd.snapshotter.v1.{name}"'
                for name in ("aufs", "btrfs", "zfs", "devmapper")
            )
            + "]",
            "[grpc]",
            f'  address = "{containerd_socket(directory)}"',
            "[ttrpc]",
            f'  address = "{containerd / "containerd.sock.ttrpc"}"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{containerd / "opt"}"',
            f"{cri}]",
            f'  sandbox_image = "{sandbox_image}"',
            # CDI devices (the device plugin's cdi-cri and cdi-annotations strategies) from
            # the node's own spec folder.
            "  enable_cdi = true",
            f'  cdi_spec_dirs = ["{cdi_spec_dir(directory)}"]',
            # runc may not lower its own OOM score without CAP_SYS_RESOURCE here.
            "  restrict_oom_score_adj = true",
            f"{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.cni]",
            f'  bin_dir = "{CNI_BIN}"',
            f'  conf_dir = "{directory / "cni"}"',
            "",
        ]
    )


def cni_conflist(directory: Path, *, pod_subnet: str) -> str:
    """The pods' network: a bridge inside the node's namespace, addresses from the node's own
    `pod_subnet` (which the host routes to the node: kube-apiserver reaches the pods), the
    node as their gateway and masquerading what they open (so that they reach the control
    plane, through kube-proxy's `kubernetes` Service, as pods do on any cluster). The node's
    namespace has no default route: nothing of a pod's leaves the cluster's bridge."""
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "gpushare-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isDefaultGateway": True,
                    "ipMasq": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": pod_subnet}]],
                        "dataDir": str(directory / "cni-ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def kubelet_config(
    directory: Path,
    *,
    address: str,
    serving_cert: Path,
    serving_key: Path,
    ca_cert: Path,
    overrides: dict[str, Any],
) -> str:
    """kubelet.yaml: serving on `address` with the serving certificate, clients of the
    cluster CA (`ca_cert`) and webhook-authorized users only; `overrides` win."""
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
        "address": address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "resolvConf": str(directory / "resolv.conf"),
        "clusterDNS": [],
        "containerRuntimeEndpoint": f"unix://{containerd_socket(directory)}",
        "imageServiceEndpoint": f"unix://{containerd_socket(directory)}",
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
        **overrides,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(directory: Path, *, name: str, address: str, pod_subnet: str) -> str:
    """kube-proxy's config: iptables mode inside the node's namespace, leaving every kernel
    setting outside it alone (conntrack sizes and timeouts are the machine's)."""
    config: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(directory / "kube-proxy.kubeconfig")},
        "hostnameOverride": name,
        "bindAddress": address,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": pod_subnet,
        "iptables": {"localhostNodePorts": False},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_node_files(
    directory: Path,
    *,
    name: str,
    address: str,
    plane: ControlPlane,
    pod_subnet: str,
    sandbox_image: str,
    kubelet_overrides: dict[str, Any],
) -> None:
    """Issue node `name`'s kubelet certificates (client: `system:node:<name>`; serving: its
    InternalIP `address`), write its kubeconfig for `plane` and the files rendered above
    (its pods' addresses from `pod_subnet`)."""
    assert plane.pki is not None
    pki = plane.pki
    client_cert, client_key = pki.issue(
        directory / "kubelet-client", f"system:node:{name}", organization="system:nodes"
    )
    serving_cert, serving_key = pki.issue(
        directory / "kubelet-serving", name, server_ips=[address], server_names=[name]
    )
    plane.write_kubeconfig(
        directory / "kubelet.kubeconfig",
        f"system:node:{name}",
        {"client-certificate": str(client_cert), "client-key": str(client_key)},
    )
    # The user the bootstrap policy binds to system:node-proxier.
    proxy_cert, proxy_key = pki.issue(directory / "kube-proxy-client", "system:kube-proxy")
    plane.write_kubeconfig(
        directory / "kube-proxy.kubeconfig",
        "system:kube-proxy",
        {"client-certificate": str(proxy_cert), "client-key": str(proxy_key)},
    )
    files = {
        directory / "containerd.toml": containerd_config(directory, sandbox_image=sandbox_image),
        directory / "cni" / "10-gpushare.conflist": cni_conflist(directory, pod_subnet=pod_subnet),
        directory / "kubelet.yaml": kubelet_config(
            directory,
            address=address,
            serving_cert=serving_cert,
            serving_key=serving_key,
            ca_cert=pki.ca_cert,
            overrides=kubelet_overrides,
        ),
        directory / "kube-proxy.yaml": kube_proxy_config(
            directory, name=name, address=address, pod_subnet=pod_subnet
        ),
    }
    for path, text in files.items():
        path.write_text(text)


FAKE_CDI_CARD = "GPUSHARE_FAKE_CDI_CARD"
"""What a fake card's CDI device sets in the container: its index (no device node to give)."""


def fake_cdi_spec(cards: int, *, kind: str = "nvidia.com/gpu") -> str:
    """A CDI spec of `cards` fake cards, named by index as `nvidia-ctk cdi generate` names
    real ones: each sets FAKE_CDI_CARD, so a container shows which one the runtime applied."""
    return json.dumps(
        {
            "cdiVersion": "0.6.0",
            "kind": kind,
            "devices": [
                {"name": str(index), "containerEdits": {"env": [f"{FAKE_CDI_CARD}={index}"]}}
                for index in range(cards)
            ],
        },
        indent=2,
    )

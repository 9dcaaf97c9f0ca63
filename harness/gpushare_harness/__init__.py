"""A real local Kubernetes cluster for development and tests.

It builds the control plane, the kubelet and its helpers from the Go module proxy
(harness/go, one pinned wrapper module) and caches them outside the repository. It starts a
bare apiserver (etcd and kube-apiserver on loopback: what `kopf run` points at locally and
what the operator's tests run against), or a whole cluster with controllers and real nodes
(`realnode`: the kubelet with containerd and runc), and fake GPU nodes whose kubelet is the
kubelet's device manager alone (`kubelet`). Nothing here is imported by the operator or the
plugin.
"""

from gpushare_harness.binaries import Binaries, ensure_binaries
from gpushare_harness.controlplane import ControlPlane, ControlPlaneError
from gpushare_harness.nodes import FakeGpuNode, create_gpu_node

__all__ = [
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "FakeGpuNode",
    "create_gpu_node",
    "ensure_binaries",
]

"""A real local Kubernetes control plane for development and tests.

It builds kube-apiserver and etcd from the Go module proxy (harness/go, one pinned wrapper
module), caches the binaries outside the repository, and starts both on free loopback ports
with TLS, RBAC and an admin kubeconfig: what `kopf run` points at locally, and what the
integration tests run against. Nothing here is imported by the operator or the plugin.
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

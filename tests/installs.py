"""A real node with gpushare installed on it the way an admin installs it (`installed_by`):
the images built from the Dockerfiles and imported into the node's containerd, the node
labelled `gpushare=true`, then `install(...)` (kustomize or Helm), waited for until the
operator's Deployment and the device plugin's DaemonSet have rolled out."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare.model import contract
from gpushare_harness.imagebuild import BuiltImage, build_images
from gpushare_harness.realnode import RealCluster, RealNode, RealNodeError, check_prerequisites

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
NODE = "gpu-node-1"
GUIDE_CARD_MIB = 11178


@dataclass
class Installed:
    cluster: RealCluster
    node: RealNode
    images: dict[str, BuiltImage]
    kubeconfig: Path
    operator_namespace: str = "gpushare-system"
    plugin_namespace: str = "gpushare-device-plugin"  # the kustomize install's; Helm's: one

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.cluster.plane is not None
        result = subprocess.run(
            [str(self.cluster.plane.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
        return result

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", "-o", "json", *args).stdout)
        return found

    def rolled_out(self) -> None:
        for namespace, workload in (
            (self.operator_namespace, "deployment/gpushare-operator"),
            (self.plugin_namespace, "daemonset/gpushare-device-plugin"),
        ):
            done = self.kubectl(
                "-n", namespace, "rollout", "status", workload, "--timeout=240s", check=False
            )
            assert done.returncode == 0, f"{workload} did not roll out:\n{self.diagnosis()}"
        self.admitting()

    def admitting(self, timeout_s: float = 60) -> None:
        """The admission webhook converts GPU pods: the guide's pod passes a server-side dry
        run (which runs admission, as README's install section says to check)."""
        guide = str(MANIFESTS / "examples" / "gpu-pod1.yaml")
        deadline = time.monotonic() + timeout_s
        while True:
            tried = self.kubectl("create", "--dry-run=server", "-f", guide, check=False)
            if tried.returncode == 0:
                return
            assert time.monotonic() < deadline, f"{tried.stderr}\n{self.diagnosis()}"
            time.sleep(1)

    def diagnosis(self) -> str:
        """What a person would look at: the pods, the events, the gpushare pods' logs."""
        parts = [
            self.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout,
            self.kubectl("get", "events", "-A", check=False).stdout[-6000:],
        ]
        for namespace in sorted({self.operator_namespace, self.plugin_namespace}):
            logs = self.kubectl(
                "-n", namespace, "logs", "--all-containers", "--prefix", "--tail=30",
                "-l", "app.kubernetes.io/part-of=gpushare", check=False,
            )  # fmt: skip
            parts.append(logs.stdout[-6000:] + logs.stderr[-2000:])
        return "\n".join(parts)

    def running(self, pod: str, timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.get("pod", pod)
            phase = found["status"].get("phase")
            assert phase != "Failed", f"{pod} failed: {found['status']}"
            if phase == "Running":
                return found
            assert time.monotonic() < deadline, f"{pod} not Running: {found['status']}"
            time.sleep(0.5)

    def gpu_env(self, pod: str) -> dict[str, str]:
        """The GPU env a process in the running pod sees (`kubectl exec POD -- env`)."""
        deadline = time.monotonic() + 60
        while True:
            result = self.kubectl("exec", pod, "--", "env", check=False)
            if result.returncode == 0:
                break
            assert time.monotonic() < deadline, result.stderr
            time.sleep(1)
        env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        keys = (
            contract.ENV_VISIBLE_DEVICES,
            contract.ENV_GPU_ALLOCATED,
            contract.ENV_GPU_MEMORY_TOTAL,
        )
        return {key: env[key] for key in keys if key in env}


def installed_by(
    directory: Path,
    install: Callable[[Installed], None],
    *,
    namespaces: tuple[str, str] = ("gpushare-system", "gpushare-device-plugin"),
) -> Iterator[Installed]:
    """A real cluster with one real node and gpushare installed by `install`, its operator
    and its device plugin in `namespaces`; removed after."""
    try:
        check_prerequisites()
    except RealNodeError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    images = build_images()
    cluster = RealCluster(directory)
    try:
        cluster.start()
        assert cluster.plane is not None
        node = cluster.add_node(NODE)
        for image in images.values():
            node.import_image(image.archive)
        done = Installed(cluster, node, images, cluster.plane.kubeconfig, *namespaces)
        done.kubectl("label", "node", NODE, "gpushare=true")
        install(done)
        done.rolled_out()
        yield done
    finally:
        for name, real in cluster.nodes.items():  # kept for a failure's reader
            for log in ("kubelet.log", "containerd.log", "kube-proxy.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(real.directory / log, directory / f"{name}-{log}")
        cluster.stop()

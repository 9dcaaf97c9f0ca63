"""kube-apiserver, etcd, kubectl and the kubelet device-manager harness, built from the Go
module proxy and cached outside the repository.

The wrapper module in harness/go pins k8s.io/kubernetes and every staging module, and etcd's
server; it also holds kubelet-devices (harness/go/kubeletdevices), the kubelet's own device
manager acting for one fake node. A build is keyed by the hash of go.mod, go.sum and our Go
sources, so changing a pin or the harness rebuilds and nothing else does. Cache:
$GPUSHARE_CACHE, else ~/.cache/gpushare.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GO_MODULE = Path(__file__).resolve().parents[1] / "go"


class BuildError(RuntimeError):
    """The binaries could not be built; the message says what to install or fix."""


@dataclass(frozen=True, kw_only=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    kubelet_devices: Path
    kubectl: Path

    @property
    def present(self) -> bool:
        return all(
            p.is_file()
            for p in (self.kube_apiserver, self.etcd, self.kubelet_devices, self.kubectl)
        )


def cache_dir() -> Path:
    return Path(os.environ.get("GPUSHARE_CACHE") or Path.home() / ".cache" / "gpushare")


def kubernetes_version() -> str:
    """The pinned k8s.io/kubernetes version, e.g. ``v1.36.3``."""
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (GO_MODULE / "go.mod").read_text(), re.M)
    if found is None:
        raise BuildError(f"{GO_MODULE / 'go.mod'} does not require k8s.io/kubernetes")
    return found[1]


def expected_binaries() -> Binaries:
    digest = hashlib.sha256()
    sources = [GO_MODULE / "go.mod", GO_MODULE / "go.sum", *sorted(GO_MODULE.rglob("*.go"))]
    for source in sources:
        digest.update(source.relative_to(GO_MODULE).as_posix().encode())
        digest.update(source.read_bytes())
    folder = cache_dir() / "bin" / f"{kubernetes_version()}-{digest.hexdigest()[:12]}"
    return Binaries(
        kube_apiserver=folder / "kube-apiserver",
        etcd=folder / "etcd",
        kubelet_devices=folder / "kubelet-devices",
        kubectl=folder / "kubectl",
    )


def ensure_binaries(*, log: bool = True) -> Binaries:
    """The cached binaries, building them first when they are absent (about 4 minutes on 2
    cores with a cold Go cache)."""
    binaries = expected_binaries()
    if binaries.present:
        return binaries
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is needed to build kube-apiserver and "
            "etcd; install it and put `go` on PATH"
        )
    version = kubernetes_version()
    major, minor = version.lstrip("v").split(".")[:2]
    ldflags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion={version} "
        f"-X k8s.io/component-base/version.gitMajor={major} "
        f"-X k8s.io/component-base/version.gitMinor={minor}"
    )
    builds = {
        binaries.kube_apiserver: "k8s.io/kubernetes/cmd/kube-apiserver",
        binaries.etcd: "go.etcd.io/etcd/server/v3",
        binaries.kubelet_devices: "./kubeletdevices",
        binaries.kubectl: "k8s.io/kubernetes/cmd/kubectl",
    }
    binaries.kube_apiserver.parent.mkdir(parents=True, exist_ok=True)
    for target, package in builds.items():
        if target.is_file():
            continue
        if log:
            print(f"gpushare-dev: building {package} -> {target}", file=sys.stderr, flush=True)
        partial = target.with_suffix(".partial")
        result = subprocess.run(
            [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), package],
            cwd=GO_MODULE,
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"building {package} failed:\n{result.stderr[-4000:]}")
        partial.rename(target)  # only a complete binary ever has the final name
    return binaries

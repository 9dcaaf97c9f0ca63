"""The binaries the harness runs, built from the Go module proxy and cached outside the
repository: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and the
kubelet (for real nodes), kubectl, kubelet-devices, pause, Helm, and containerd with its runc
shim and ctr (for real nodes: Debian bookworm's containerd 1.6 has no CDI).

The wrapper module in harness/go pins k8s.io/kubernetes and every staging module, and etcd's
server; it also holds kubelet-devices (harness/go/kubeletdevices), the kubelet's own device
manager acting for one fake node, and pause (harness/go/pause), the real node's sandbox
image. Helm (for the chart's tests) is built in harness/go/helm and containerd in
harness/go/containerd, modules of their own. A build is keyed by the hash of every module's
go.mod and go.sum and our Go sources, so changing a pin or the harness rebuilds and nothing
else does. Cache: $GPUSHARE_CACHE, else ~/.cache/gpushare.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GO_MODULE = Path(__file__).resolve().parents[1] / "go"


class BuildError(RuntimeError):
    """The binaries could not be built; the message says what to install or fix."""


# What each binary is built from (a package of the wrapper module or of its requirements).
_PACKAGES = {
    "kube_apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube_controller_manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube_scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube_proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kubelet_devices": "./kubeletdevices",
    "pause": "./pause",
    "helm": "helm.sh/helm/v4/cmd/helm",
    "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
    "containerd_shim_runc_v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
}
# Built in modules of their own (their Kubernetes libraries must not move the cluster's).
_CONTAINERD = GO_MODULE / "containerd"
_OWN_MODULES = {
    "helm": GO_MODULE / "helm",
    "containerd": _CONTAINERD,
    "containerd_shim_runc_v2": _CONTAINERD,
    "ctr": _CONTAINERD,
}


@dataclass(frozen=True, kw_only=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kube_proxy: Path
    kubectl: Path
    kubelet: Path
    kubelet_devices: Path
    pause: Path
    helm: Path
    containerd: Path
    containerd_shim_runc_v2: Path
    ctr: Path

    def paths(self) -> dict[str, Path]:
        return {field: getattr(self, field) for field in _PACKAGES}

    @property
    def present(self) -> bool:
        return all(path.is_file() for path in self.paths().values())


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
    modules = [GO_MODULE, *dict.fromkeys(_OWN_MODULES.values())]
    sources = [module / name for module in modules for name in ("go.mod", "go.sum")]
    sources += sorted(GO_MODULE.rglob("*.go"))
    for source in sources:
        digest.update(source.relative_to(GO_MODULE).as_posix().encode())
        digest.update(source.read_bytes())
    folder = cache_dir() / "bin" / f"{kubernetes_version()}-{digest.hexdigest()[:12]}"
    return Binaries(**{field: folder / field.replace("_", "-") for field in _PACKAGES})


def ensure_binaries(*, log: bool = True) -> Binaries:
    """The cached binaries, building them first when they are absent (about 8 minutes on 2
    cores with a cold Go cache): one `go build` per module, so that the compiles and links of
    its commands overlap (each link takes a few GiB)."""
    binaries = expected_binaries()
    if binaries.present:
        return binaries
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is needed to build kube-apiserver, etcd and the "
            "kubelet; install it and put `go` on PATH"
        )
    version = kubernetes_version()
    major, minor = version.lstrip("v").split(".")[:2]
    ldflags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion={version} "
        f"-X k8s.io/component-base/version.gitMajor={major} "
        f"-X k8s.io/component-base/version.gitMinor={minor}"
    )
    folder = binaries.kube_apiserver.parent
    folder.mkdir(parents=True, exist_ok=True)
    by_module: dict[Path, list[str]] = {}
    for field, target in binaries.paths().items():
        if not target.is_file():
            by_module.setdefault(_OWN_MODULES.get(field, GO_MODULE), []).append(field)
    for module, fields in by_module.items():
        packages = [_PACKAGES[field] for field in fields]
        if log:
            print(f"gpushare-dev: building {' '.join(packages)}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=folder) as staging:
            result = subprocess.run(
                [go, "build", "-trimpath", "-ldflags", ldflags, "-o", staging + "/", *packages],
                cwd=module,
                env={**os.environ, "CGO_ENABLED": "0"},
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise BuildError(f"building {' '.join(packages)} failed:\n{result.stderr[-4000:]}")
            for field in fields:  # only a complete binary ever has the final name
                (Path(staging) / _command_name(_PACKAGES[field])).rename(getattr(binaries, field))
    return binaries


def _command_name(package: str) -> str:
    """The file `go build -o DIR/` writes a command package to: its last path element, or the
    one before a major-version element (go.etcd.io/etcd/server/v3 -> server)."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]

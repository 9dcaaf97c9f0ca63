"""Teardown of real nodes (`gpushare_harness.realnode`), running or left by a crashed run.

Each running node records the pids of its processes beside it (node.json) and a pointer to
its folder in a registry (`record`). `cleanup` kills kube-proxy, the kubelet, the containers'
processes, containerd, its shims (found by the node's own socket path) and the holder, each by
pid and only while the pid is still ours, then removes the containers' cgroups, the host's
route to the node's pod subnet (`gpushare_harness.network`; it also goes with the cluster's
bridge) and the node's folder. The namespaces, their mounts, veth, pod bridge and iptables
rules vanish with the holder. `sweep` cleans up every recorded node whose holder is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

from gpushare_harness.binaries import cache_dir
from gpushare_harness.controlplane import alive
from gpushare_harness.network import delete_pod_route
from gpushare_harness.nodeconfig import containerd_socket, containerd_state

CGROUPS = Path("/sys/fs/cgroup")
# The names a node records its processes' pids under (also the processes' names in messages).
HOLDER = "node namespaces"
CONTAINERD = "containerd"
KUBELET = "kubelet"
KUBE_PROXY = "kube-proxy"
# The holder's last command: what tells its pid from a reused one.
HOLDER_MARK = "sleep infinity"


def registry() -> Path:
    """Where each running real node leaves a pointer to its folder (for `sweep`)."""
    return cache_dir() / "real-nodes"


def record(
    name: str,
    directory: Path,
    *,
    holder: int,
    pids: dict[str, int],
    pod_route: dict[str, str] | None = None,
) -> None:
    """The pids and paths `cleanup` needs, beside the node and in the registry (an entry
    named after the folder and the `holder`'s pid); `pod_route`: the host's route to the
    node's pods (`subnet`, `via`, `dev`), once added."""
    state: dict[str, object] = {"name": name, "directory": str(directory), "pids": pids}
    if pod_route is not None:
        state["pod_route"] = pod_route
    (directory / "node.json").write_text(json.dumps(state, indent=2))
    registry().mkdir(parents=True, exist_ok=True)
    (registry() / f"{directory.name}-{holder}.json").write_text(json.dumps(state))


def sweep() -> list[str]:
    """Clean up every real node whose holder is gone (a crashed run); their names."""
    cleaned: list[str] = []
    for entry in sorted(registry().glob("*.json")) if registry().is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads(entry.read_text())
            holder = state["pids"].get(HOLDER)
            if holder is None or not _alive(holder, HOLDER_MARK):
                cleanup(Path(state["directory"]))  # removes the entry too
                cleaned.append(state["name"])
    return cleaned


def cleanup(directory: Path) -> None:
    """Stop everything of the node in `directory` (running or left by a crash) and remove
    its containers' cgroups, the host's route to its pods and its folder."""
    state_file = directory / "node.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    pids: dict[str, int] = state.get("pids", {})
    route: dict[str, str] | None = state.get("pod_route")
    _end(pids.get(KUBE_PROXY), str(directory))
    _end(pids.get(KUBELET), str(directory))
    bundles = containerd_state(directory) / "io.containerd.runtime.v2.task" / "k8s.io"
    ids = sorted(p.name for p in bundles.iterdir()) if bundles.is_dir() else []
    for container in ids:
        with contextlib.suppress(OSError, ValueError):
            _end(int((bundles / container / "init.pid").read_text()), container, cgroup=True)
    _end(pids.get(CONTAINERD), str(directory))
    socket = str(containerd_socket(directory))
    for pid in _pids_with(socket):  # the shims, started with the node's own socket path
        _end(pid, socket)
    _end(pids.get(HOLDER), HOLDER_MARK)
    if route is not None:
        delete_pod_route(route["subnet"], route["via"], route["dev"])
    for container in ids:
        for controller in CGROUPS.iterdir() if CGROUPS.is_dir() else []:
            with contextlib.suppress(OSError):
                (controller / "k8s.io" / container).rmdir()
    for controller in CGROUPS.iterdir() if CGROUPS.is_dir() else []:
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
    """The processes whose command line contains `text`."""
    found: list[int] = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found

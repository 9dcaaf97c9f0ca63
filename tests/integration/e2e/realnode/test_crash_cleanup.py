"""A run that crashes with a real node and a running container leaves nothing behind for long:
the next real node to start (here `sweep`, which every start calls first) stops the shims and
the container's processes the crash left, removes their cgroups, the node's folder and the
cluster's bridge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpushare_harness import network, nodeteardown, realnode
from gpushare_harness.controlplane import alive

pytestmark = pytest.mark.integration

# Runs in a child that is then killed with SIGKILL: nothing of it gets to clean up.
_CRASHING_RUN = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from pathlib import Path
    from gpushare_harness.realnode import RealCluster

    cluster = RealCluster(Path(sys.argv[1])).start()
    node = cluster.add_node("crash-node")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left"},
           "spec": {"containers": [{"name": "c", "image": "nvidia/cuda:9.0-devel",
                                    "command": ["sleep", "100000"]}]}}
    kubectl = [str(cluster.plane.binaries.kubectl), "--kubeconfig", str(cluster.plane.kubeconfig)]
    subprocess.run(kubectl + ["create", "-f", "-"], input=json.dumps(pod), text=True, check=True,
                   capture_output=True)
    subprocess.run(kubectl + ["wait", "--for=condition=Ready", "pod/left", "--timeout=90s"],
                   check=True, capture_output=True)
    print(json.dumps({"node": str(node.directory), "bridge": cluster.network.bridge}), flush=True)
    time.sleep(600)
    """
)


def _processes_naming(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_a_crashed_runs_node_containers_and_bridge_are_removed_by_the_next_start(
    tmp_path: Path,
) -> None:
    try:
        realnode.check_prerequisites()
    except realnode.RealNodeError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    with subprocess.Popen(
        [sys.executable, "-c", _CRASHING_RUN, str(tmp_path / "crashed")],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            left = json.loads(child.stdout.readline())
        finally:
            child.send_signal(signal.SIGKILL)
    node = Path(left["node"])
    socket = str(node / "containerd" / "containerd.sock")
    bundles = node / "containerd" / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
    containers = [bundle.name for bundle in bundles.iterdir()]
    assert containers  # the pause and the sleeping container
    assert _processes_naming(socket)  # their shims outlived the crash

    # The crash takes the node's holder, containerd and kubelet with it (they die with their
    # parent), a moment after the run itself.
    holder = json.loads((node / "node.json").read_text())["pids"]["node namespaces"]
    deadline = time.monotonic() + 10
    while alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "crash-node" in nodeteardown.sweep()
    assert left["bridge"] in network.sweep()

    assert not _processes_naming(socket)
    assert not node.exists()
    for container in containers:
        assert not list(Path("/sys/fs/cgroup").glob(f"*/k8s.io/{container}"))
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True)
    assert left["bridge"] not in links.stdout
    assert str(node) not in Path("/proc/mounts").read_text()

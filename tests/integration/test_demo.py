"""The README's first command, end to end: `gpushare-dev demo` installs gpushare as an admin
does (images, node label, `kubectl apply -k`), shows what the user guide shows (the env
through a real `kubectl exec` on a real node), leaves the cluster running for kubectl, and
`gpushare-dev down` stops and removes all of it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cluster import dev

from gpushare_harness import ControlPlane
from gpushare_harness.controlplane import alive

pytestmark = pytest.mark.integration


def test_the_demo_shows_the_guide_and_down_stops_everything(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    directory = tmp_path / "demo"
    rules_before = host_iptables()
    shown = dev("demo", "--dir", str(directory))
    try:
        assert shown.returncode == 0, shown.stderr + shown.stdout
        out = shown.stdout
        # Installed as the README tells admins: the images, the label, kubectl apply -k.
        assert "localhost/gpushare/operator:0.1.0" in out
        assert "$ kubectl label node gpu-node-1 gpushare=true" in out
        assert "manifests/overlays/dev" in out
        assert 'deployment "gpushare-operator" successfully rolled out' in out
        assert 'daemon set "gpushare-device-plugin" successfully rolled out' in out
        # The guide's node, its pods on card 0, the annotations and the env it documents.
        rows = [line.split() for line in out.splitlines()]
        assert ["gpu-node-1", "168", "8"] in rows  # 8 x 11178 MiB in 512 MiB devices
        for pod in ("gpu-pod1", "gpu-pod2"):  # 1024 MiB stored as 2 devices, the MiB kept
            assert [pod, "2", "512", "cuda-container=1024"] in rows
        assert "gpu-pod1   1/1     Running" in out
        assert out.count("$ kubectl exec gpu-pod") == 2  # a real exec into each container
        assert out.count("HOSTNAME=gpu-pod") == 2
        assert out.count("VOLCANO_GPU_MEMORY_TOTAL=11178") == 2
        assert out.count("VOLCANO_GPU_ALLOCATED=1024") == 2
        assert out.count("NVIDIA_VISIBLE_DEVICES=0") == 2
        for pod in ("gpu-pod1", "gpu-pod2"):
            assert any(
                line.split()[:2] == [pod, "0"] and line.split()[-1] == "true"
                for line in out.splitlines()
            ), f"{pod}: gpu-index 0 and gpu-assigned true not shown"
        # inspect -d: each pod's grant, and what it holds once the plugin measured (no process
        # runs on the fake cards: 0).
        assert re.search(
            r"default/gpu-pod1 1024 MiB( \(uses 0\))?, default/gpu-pod2 1024 MiB( \(uses 0\))?", out
        ), out
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in out
        assert "export PATH=" in out  # kubectl, gpushare and kubectl gpushare
        state = json.loads((directory / "state.json").read_text())
        node_directory = Path(state["nodes"]["gpu-node-1"])
        node = json.loads((node_directory / "node.json").read_text())
        pids = [*state["pids"].values(), *state["components"].values(), *node["pids"].values()]
        # The control plane's; the fake node's kubelet-devices and plugin; the real node's
        # holder, containerd, kubelet and kube-proxy (gpushare runs in its pods).
        assert len(pids) == 4 + 2 + 4
        assert all(alive(pid) for pid in pids)  # left running for the person
        bridge = state["network"]["bridge"]
    finally:
        down = dev("down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in pids)
    assert not node_directory.exists()
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True)
    assert bridge not in links.stdout
    mounts = Path("/proc/mounts").read_text()
    assert str(node_directory) not in mounts
    assert host_iptables() == rules_before  # the kubelet's chains lived in the node's namespace


def host_iptables() -> list[str]:
    """The host's iptables rules, without the comments and counters that change by
    themselves."""
    saved = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return [line.split(" [")[0] for line in saved.splitlines() if not line.startswith("#")]

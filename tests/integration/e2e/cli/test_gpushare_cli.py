"""`gpushare inspect | explain | simulate` against a live cluster: a node run by the device
plugin and the kubelet's device manager, the operator placing pods."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import create_pod, gpu_pod, unschedulable
from kubernetes_asyncio import client

from gpushare_harness import ControlPlane
from gpushare_harness.controlplane import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def gpushare(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def kubectl_gpushare(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl gpushare ...`: kubectl finds the kubectl-gpushare script on PATH."""
    return subprocess.run(
        [str(plane.binaries.kubectl), "gpushare", *args],
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "KUBECONFIG": str(plane.kubeconfig),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def test_inspect_explain_and_simulate_show_what_the_scheduler_sees(
    plane: ControlPlane,
    core: client.CoreV1Api,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
    tmp_path: Path,
) -> None:
    node = await gpu_node("gpu-node-1", "2x11178")
    # The CLI's own environment says nothing of the policy: it takes the operator's.
    start_operator(GPUSHARE_POLICY="firstfit")
    await create_pod(core, gpu_pod("gpu-pod1", 1024))
    await asyncio.to_thread(node.kubelet.wait_started, "default/gpu-pod1", "cuda-container")
    await create_pod(core, gpu_pod("too-big", 20000))
    await unschedulable(core, "too-big")

    shown = gpushare(plane.kubeconfig, "inspect", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    (report,) = json.loads(shown.stdout)
    assert report["node"] == "gpu-node-1"
    assert (report["usedMiB"], report["totalMiB"]) == (1024, 2 * 11178)
    card0, card1 = report["cards"]
    # measuredMiB: what the pod's processes hold, once the plugin has measured (none here).
    held = [{k: v for k, v in pod.items() if k != "measuredMiB"} for pod in card0["pods"]]
    assert (card0["usedMiB"], card0["totalMiB"], held) == (
        1024,
        11178,
        [{"namespace": "default", "name": "gpu-pod1", "mib": 1024}],
    )
    assert card0["pods"][0]["measuredMiB"] in (None, 0)
    assert (card1["usedMiB"], card1["health"], card0["model"]) == (0, "Healthy", "Fake GPU")

    as_plugin = kubectl_gpushare(plane, "inspect", "-o", "json")
    assert json.loads(as_plugin.stdout) == [report], as_plugin.stderr
    table = gpushare(plane.kubeconfig, "inspect")
    assert "GPU0(Used/Total)" in table.stdout
    assert "1024/11178" in table.stdout
    detail = gpushare(plane.kubeconfig, "inspect", "gpu-node-1", "-d")
    assert "default/gpu-pod1 1024 MiB" in detail.stdout

    bound = gpushare(plane.kubeconfig, "explain", "gpu-pod1")
    assert "bound to gpu-node-1, card 0; served by the device plugin" in bound.stdout
    waiting = gpushare(plane.kubeconfig, "explain", "too-big")
    assert (
        "cannot be placed on any node, even with no other pod: 0/1 nodes are available"
        in waiting.stdout
    )
    assert "card 0 10154 MiB free < 20000 MiB" in waiting.stdout
    assert "card 1 11178 MiB free < 20000 MiB" in waiting.stdout
    as_json = json.loads(gpushare(plane.kubeconfig, "explain", "too-big", "-o", "json").stdout)
    assert as_json["state"] == "Never"
    assert as_json["nodes"][0]["cards"][0] == {
        "index": 0,
        "problem": "TooLittleMemory",
        "freeMiB": 10154,
        "neededMiB": 20000,
    }
    assert as_json["schedulerSays"].startswith("0/1 nodes are available")

    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(gpu_pod("what-if", 5000)))
    simulated = gpushare(plane.kubeconfig, "simulate", "-f", str(manifest))
    assert simulated.returncode == 0, simulated.stderr
    # First-fit, as the operator decides (card 0 is also best-fit's: 10154 MiB free).
    assert "would be placed now (firstfit): gpu-node-1 card 0 (5154 MiB left)" in simulated.stdout
    assert "decided as the operator op-1 decides" in simulated.stdout
    pods = await core.list_namespaced_pod("default")
    assert "what-if" not in {p.metadata.name for p in pods.items}  # nothing was written

    # Two whole cards: not now (gpu-pod1 holds card 0), but once it goes: exit status 3.
    manifest.write_text(yaml.safe_dump(gpu_pod("two-cards", number=2)))
    waits = gpushare(plane.kubeconfig, "simulate", "-f", str(manifest))
    assert waits.returncode == 3, waits.stdout + waits.stderr
    assert "cannot be placed now: 0/1 nodes are available" in waits.stdout
    # Larger than any card: waiting will not help, exit status 4.
    manifest.write_text(yaml.safe_dump(gpu_pod("huge", 20000)))
    never = gpushare(plane.kubeconfig, "simulate", "-f", str(manifest))
    assert never.returncode == 4, never.stdout + never.stderr
    assert "cannot be placed on any node, even with no other pod" in never.stdout

    manifest.write_text(yaml.safe_dump(gpu_pod("elsewhere", 1024, scheduler="team-b")))
    unserved = gpushare(plane.kubeconfig, "simulate", "-f", str(manifest))
    assert (
        "team-b, if it runs, binds it with no card chosen, and the gpushare device plugin then "
        "refuses to start it" in unserved.stdout
    )
    assert "create it with spec.schedulerName: volcano" in unserved.stdout


async def test_the_cli_fails_clearly_on_a_missing_pod_a_bad_file_or_no_cluster(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    missing = gpushare(plane.kubeconfig, "explain", "nope", "-n", "team-a")
    assert missing.returncode == 1
    assert "pod nope not found in namespace team-a" in missing.stderr
    unknown = gpushare(plane.kubeconfig, "inspect", "ghost")
    assert (unknown.returncode, unknown.stderr.strip()) == (1, "gpushare: node ghost not found")

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\nspec: [unclosed\n")
    refused = gpushare(plane.kubeconfig, "simulate", "-f", str(bad))
    assert refused.returncode == 2
    assert "is not valid YAML" in refused.stderr
    bad.write_text(yaml.safe_dump({"kind": "Deployment"}))
    assert (
        "must hold one Pod manifest"
        in gpushare(plane.kubeconfig, "simulate", "-f", str(bad)).stderr
    )

    nowhere = plane.token_kubeconfig(tmp_path / "nowhere", "nobody", "t")
    text = nowhere.read_text().replace(
        plane.endpoints.server if plane.endpoints else "", f"https://127.0.0.1:{free_port()}"
    )
    nowhere.write_text(text)
    unreachable = gpushare(nowhere, "inspect")
    assert unreachable.returncode == 1
    assert "cannot reach the cluster" in unreachable.stderr


async def test_the_cli_takes_the_kubeconfigs_context_and_its_flags_anywhere(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """As kubectl: --context picks the context, whose namespace is the default one; -A looks
    in every namespace; the global flags go before or after the subcommand."""
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-c")))
    await create_pod(core, gpu_pod("only-in-team-c", 1024), namespace="team-c")
    config = yaml.safe_load(plane.kubeconfig.read_text())
    admin = config["contexts"][0]["context"]
    config["contexts"].append({"name": "team", "context": {**admin, "namespace": "team-c"}})
    kubeconfig = tmp_path / "contexts.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))

    in_default = gpushare(kubeconfig, "explain", "only-in-team-c")
    assert in_default.returncode == 1
    assert "pod only-in-team-c not found in namespace default" in in_default.stderr
    for args in (
        ("--context", "team", "explain", "only-in-team-c", "-o", "json"),
        ("explain", "only-in-team-c", "--context", "team", "-o", "json"),
        ("-o", "json", "explain", "-A", "only-in-team-c"),
    ):
        shown = gpushare(kubeconfig, *args)
        assert shown.returncode == 0, (args, shown.stderr)
        assert json.loads(shown.stdout)["pod"] == "team-c/only-in-team-c", args
        assert json.loads(shown.stdout)["operator"] is None  # none runs in this test
    unknown = gpushare(kubeconfig, "--context", "nope", "inspect")
    assert unknown.returncode == 2
    assert "context 'nope' is not in the kubeconfig" in unknown.stderr
    table = gpushare(kubeconfig, "explain", "only-in-team-c", "-n", "team-c")
    assert "note: no gpushare operator leads now" in table.stdout
    helped = gpushare(kubeconfig, "--help")
    assert "Exit status: 0 done" in helped.stdout

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
from typing import Any, cast

import pytest
import yaml
from cluster import create_pod, eventually, gpu_pod, unschedulable
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.controlplane import free_port
from gpushare_harness.identities import tenant_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOO_LITTLE = ["too", "little", "free", "memory", "(<", "20000)"]


def gpushare(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def kubectl(plane: ControlPlane, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],
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
    # measuredMiB, grantedMiB: what the pod's processes hold and its measured containers were
    # granted, once the plugin has measured (nothing runs on fake cards).
    measurement = ("measuredMiB", "grantedMiB")
    held = [{k: v for k, v in pod.items() if k not in measurement} for pod in card0["pods"]]
    assert (card0["usedMiB"], card0["totalMiB"], held) == (
        1024,
        11178,
        [{"namespace": "default", "name": "gpu-pod1", "mib": 1024, "over": False}],
    )
    assert card0["pods"][0]["measuredMiB"] in (None, 0)
    assert (card1["usedMiB"], card1["health"], card0["model"]) == (0, "Healthy", "Fake GPU")

    as_plugin = kubectl_gpushare(plane, "inspect", "-o", "json")
    assert json.loads(as_plugin.stdout) == [report], as_plugin.stderr
    as_yaml = gpushare(plane.kubeconfig, "inspect", "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout) == [report], as_yaml.stderr
    wide_inspect = gpushare(plane.kubeconfig, "inspect", "-o", "wide").stdout.splitlines()
    assert wide_inspect[1].split()[:5] == ["gpu-node-1", "0", "Fake", "GPU", card0["uuid"]]
    health, used, measured, count = wide_inspect[1].split()[-4:]
    assert (health, used, count) == ("Healthy", "1024/11178", "1")
    assert measured in ("-", "0")  # once the plugin has measured: nothing runs on fake cards
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
    # What it asks, said once; the node's largest free card once (every card: -o wide).
    assert "it asks for 20000 MiB on one card" in waiting.stdout
    assert waiting.stdout.count("20000 MiB") == 1
    assert "gpu-node-1  no card with enough free GPU memory  most free: card 1, 11178 MiB" in (
        waiting.stdout
    )
    wide = gpushare(plane.kubeconfig, "explain", "too-big", "-o", "wide").stdout.splitlines()
    assert wide[-2].split()[-11:] == ["0", "Fake", "GPU", "10154", "11178", *TOO_LITTLE]
    assert wide[-1].split() == ["1", "Fake", "GPU", "11178", "11178", *TOO_LITTLE]
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
    assert "`gpushare_operator.scheduling.decision.plan`" in helped.stdout
    assert kubectl_gpushare(plane, "--help").stdout.startswith("usage: kubectl gpushare ")
    assert gpushare(kubeconfig, "--version").stdout.startswith("gpushare 0.1.0 (kube-gpushare")


async def aggregate(api: client.ApiClient, role: str) -> None:
    """What the controller-manager's clusterrole-aggregation controller does (a bare control
    plane runs none): `role`'s rules become those of the ClusterRoles its aggregationRule
    selects, so the built-in `view` and `edit` grant what they grant on a cluster."""
    rbac = client.RbacAuthorizationV1Api(api)
    body = await raw_json(rbac.read_cluster_role(role, _preload_content=False))
    rules: list[dict[str, Any]] = []
    for selector in body["aggregationRule"]["clusterRoleSelectors"]:
        labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
        listed = await raw_json(
            rbac.list_cluster_role(label_selector=labels, _preload_content=False)
        )
        rules += [rule for item in listed["items"] for rule in item.get("rules") or ()]
    await raw_json(
        rbac.patch_cluster_role(
            role, cast(client.V1ClusterRole, {"rules": rules}), _preload_content=False
        )
    )


async def test_a_tenant_with_edit_in_one_namespace_explains_its_own_pods(
    plane: ControlPlane,
    api: client.ApiClient,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """A ServiceAccount with the built-in `edit` role in team-a only (no Nodes, no pods of
    other namespaces) explains its pods: the cards' use comes from the GPUNodes' status (the
    shipped roles let every user read GPUNodes and the operator's Lease), and stderr says,
    one line each, what it could not see. Without the GPUNodes, a bound pod is still
    explained and a waiting one says what is missing."""
    core = client.CoreV1Api(api)
    node = await gpu_node("gpu-node-1", "2x11178")
    start_operator()
    for namespace in ("team-a", "team-b"):
        await core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
    await create_pod(core, gpu_pod("other", 6000), namespace="team-b")
    await asyncio.to_thread(node.kubelet.wait_started, "team-b/other", "cuda-container")
    # Best-fit: mine goes beside team-b's pod on card 0 (the tighter fit).
    await create_pod(core, gpu_pod("mine", 1024), namespace="team-a")
    await asyncio.to_thread(node.kubelet.wait_started, "team-a/mine", "cuda-container")
    await create_pod(core, gpu_pod("too-big", 20000), namespace="team-a")
    await unschedulable(core, "too-big", namespace="team-a")
    custom = client.CustomObjectsApi(api)

    async def counted() -> bool:
        status = (
            await custom.get_cluster_custom_object(
                contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, "gpunodes", "gpu-node-1"
            )
        ).get("status") or {}
        return [c.get("allocatedMiB") for c in status.get("cards") or ()] == [7024, 0]

    await eventually(counted, what="the GPUNode's status counting both pods")
    for role in ("view", "edit"):  # view's rules are part of edit's
        await aggregate(api, role)
    tenant = await tenant_kubeconfig(core, plane.kubeconfig, "team-a", tmp_path / "tenant")
    assert "forbidden" in kubectl(plane, tenant, "get", "pods", "-A").stderr
    assert "forbidden" in kubectl(plane, tenant, "get", "nodes").stderr

    seen_from_a = [
        "note: nodes are not visible to you: the cards are read from the GPUNodes, and the "
        "nodes' readiness, taints, labels and CPU/memory are not checked",
        "note: pods of namespaces other than team-a are not visible to you: the cards' use is "
        "taken from the GPUNodes' status (and only team-a's pods are weighed for preemption)",
        "note: PodDisruptionBudgets of namespaces other than team-a are not visible to you: "
        "preemption is shown as if none covered the pods there",
    ]
    bound_pod = gpushare(tenant, "explain", "mine", "-n", "team-a")
    assert bound_pod.returncode == 0, bound_pod.stderr
    assert "bound to gpu-node-1, card 0; served by the device plugin" in bound_pod.stdout
    assert bound_pod.stderr.splitlines() == seen_from_a
    waiting = gpushare(tenant, "explain", "too-big", "-n", "team-a")
    assert waiting.returncode == 0, waiting.stderr
    assert "decided as the operator op-1 decides" in waiting.stdout  # the Lease is readable
    assert "cannot be placed on any node, even with no other pod" in waiting.stdout
    assert "most free: card 1, 11178 MiB" in waiting.stdout
    wide = gpushare(tenant, "explain", "too-big", "-n", "team-a", "-o", "wide").stdout
    assert wide.splitlines()[-2].split()[-9:-6] == ["GPU", "4154", "11178"]  # team-b's counted
    as_json = gpushare(tenant, "inspect", "-o", "json", "-n", "team-a")
    card0 = json.loads(as_json.stdout)[0]["cards"][0]
    assert (card0["usedMiB"], card0["otherNamespacesMiB"], card0["otherNamespacesPods"]) == (
        7024,
        6000,
        ["team-b/other"],
    )
    assert [pod["name"] for pod in card0["pods"]] == ["mine"]
    detail = gpushare(tenant, "inspect", "-d", "-n", "team-a")
    (card0_row,) = [line for line in detail.stdout.splitlines() if "team-a/mine" in line]
    assert card0_row.endswith("other namespaces' pods 6000 MiB")  # (uses N): measured
    assert "team-b/other" not in detail.stdout

    # Without the shipped binding that lets every user read GPUNodes:
    await raw_json(
        client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(
            "gpushare-view", _preload_content=False
        )
    )

    async def blind() -> subprocess.CompletedProcess[str] | None:
        shown = await asyncio.to_thread(gpushare, tenant, "explain", "too-big", "-n", "team-a")
        return shown if shown.returncode == 1 else None

    refused = await eventually(blind, what="the tenant to lose GPUNodes")
    assert refused.stderr.splitlines()[-1] == (
        "gpushare: pod team-a/too-big is not bound (the scheduler says: "
        + (await unschedulable(core, "too-big", namespace="team-a"))
        + "); where it could go cannot be worked out: neither nodes nor GPUNodes are visible "
        "to you, so the cards cannot be known; ask for read access to gpunodes.gpushare.io "
        "(cluster-wide)"
    )
    still = gpushare(tenant, "explain", "mine", "-n", "team-a")
    assert still.returncode == 0, still.stderr
    assert "bound to gpu-node-1, card 0" in still.stdout
    assert (
        "note: GPUNodes are not visible to you: the cards cannot be known; ask for read access "
        "to gpunodes.gpushare.io (cluster-wide)" in still.stderr.splitlines()
    )

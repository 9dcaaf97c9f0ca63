"""The admission webhook and policy against the real apiserver, with the operator serving the
webhook (as a local process, on loopback) and fake nodes whose kubelet device manager and
device plugin run at the cluster's default unit, 512 MiB per device.

What a user sees is asserted: the pod as stored (limits, annotations), the refusal message
`kubectl` would print, the container env, the pod's node.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from admitting import NOT_ADMITTED, create, limit, ready, refusal
from cluster import bound, create_pod, eventually, gpu_pod, read_pod
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.crds import install_admission
from gpushare_harness.operator import webhook_url

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

UNIT = contract.DEFAULT_MEMORY_UNIT_MIB


async def test_the_guides_pod_is_written_in_mib_runs_in_units_and_is_told_its_mib(
    core: client.CoreV1Api, gpu_node: Any, operators: Any, admission: None
) -> None:
    node = await gpu_node("gpu-node-1", "8x11178", unit_mib=None)
    operators()
    await ready(core)
    created = await create(core, gpu_pod("gpu-pod1", 1024))
    assert limit(created) == str(1024 // UNIT)
    assert created["spec"]["containers"][0]["resources"]["requests"][contract.GPU_MEMORY] == "2"
    annotations = created["metadata"]["annotations"]
    assert annotations[contract.MEMORY_UNIT_MIB] == str(UNIT)
    assert annotations[contract.GPU_MEMORY_MIB] == "cuda-container=1024"
    assert created["metadata"]["labels"] == {contract.GPU_POD_LABEL: "true"}
    await bound(core, "gpu-pod1")
    line = await asyncio.to_thread(node.kubelet.wait_started, "default/gpu-pod1", "cuda-container")
    assert line["envs"][contract.ENV_GPU_ALLOCATED] == "1024"
    assert line["envs"][contract.ENV_GPU_MEMORY_TOTAL] == "11178"
    assert len(line["devices"][contract.GPU_MEMORY]) == 2

    # Rounded up, never down; the container is told what it asked.
    odd = await create(core, gpu_pod("odd", 1000))
    assert limit(odd) == "2"
    await bound(core, "odd")
    line = await asyncio.to_thread(node.kubelet.wait_started, "default/odd", "cuda-container")
    assert line["envs"][contract.ENV_GPU_ALLOCATED] == "1000"

    # 40 GiB asks for 80 devices, not 40,960.
    big = await create(core, gpu_pod("big", 40960))
    assert limit(big) == "80"


async def test_converting_is_idempotent_for_a_pod_recreated_from_its_yaml(
    core: client.CoreV1Api, operators: Any, admission: None
) -> None:
    operators()
    await ready(core)
    first = await create(core, gpu_pod("first", 3000, nodeSelector={"none": "none"}))
    copy = gpu_pod("copy", limit(first), nodeSelector={"none": "none"})
    copy["metadata"]["annotations"] = first["metadata"]["annotations"]
    again = await create(core, copy)
    assert limit(again) == limit(first) == "6"
    assert again["metadata"]["annotations"][contract.GPU_MEMORY_MIB] == "cuda-container=3000"


async def test_with_the_webhook_down_gpu_pods_are_refused_and_other_pods_are_not(
    core: client.CoreV1Api, api: client.ApiClient, admission: None
) -> None:
    message = ""

    async def refused_clearly() -> bool:
        nonlocal message
        try:
            await create_pod(core, gpu_pod("orphan", 1024))
        except ApiError as error:
            message = error.message
            return NOT_ADMITTED in message
        # Created before the apiserver loaded the policy: try again.
        await core.delete_namespaced_pod("orphan", "default", grace_period_seconds=0)
        return False

    await eventually(refused_clearly, timeout_s=20, what="the policy in force")
    assert "gpushare-operator" in message
    plain = gpu_pod("plain")
    plain["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    await create_pod(core, plain)
    # Whole cards need no conversion, but the label that puts their placement under the
    # placement policy: refused for want of it.
    cards = await refusal(core, gpu_pod("cards", number=1, nodeSelector={"none": "none"}))
    assert NOT_ADMITTED in cards
    assert contract.GPU_POD_LABEL in cards
    # Converted, not labelled, as a replica from before the label left it during an upgrade.
    converted = gpu_pod("converted", 2, nodeSelector={"none": "none"})
    converted["metadata"]["annotations"] = {
        contract.MEMORY_UNIT_MIB: str(UNIT),
        contract.GPU_MEMORY_MIB: "cuda-container=1024",
    }
    unlabelled = await refusal(core, converted)
    assert "did not label it gpushare.io/gpu-pod" in unlabelled
    assert "while gpushare is being upgraded" in unlabelled


async def test_a_pod_that_bypasses_the_scheduler_is_refused_naming_the_fix(
    core: client.CoreV1Api, operators: Any, admission: None
) -> None:
    operators()
    await ready(core)
    message = await refusal(core, gpu_pod("bypass", 1024, nodeName="gpu-node-1"))
    assert "spec.nodeName" in message
    assert "kubernetes.io/hostname: gpu-node-1" in message
    message = await refusal(core, gpu_pod("bypass-cards", number=1, nodeName="gpu-node-1"))
    assert "placed by the gpushare scheduler" in message


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (gpu_pod("suffix", "1Gi"), "binary suffix"),
        (gpu_pod("both", 1024, number=1), "both"),
        (gpu_pod("default", 1024, scheduler="default-scheduler"), "schedulerName: volcano"),
    ],
    ids=["binary-suffix", "both-resources", "unserved-scheduler-name"],
)
async def test_a_gpu_pod_that_could_never_run_is_refused_at_creation(
    core: client.CoreV1Api, operators: Any, admission: None, pod: dict[str, Any], expected: str
) -> None:
    operators()
    await ready(core)
    assert expected in await refusal(core, pod)


async def test_requests_without_limits_are_refused_at_creation(
    core: client.CoreV1Api, operators: Any, admission: None
) -> None:
    operators()
    await ready(core)
    pod = gpu_pod("requests-only")
    pod["spec"]["containers"][0]["resources"] = {"requests": {contract.GPU_MEMORY: "1024"}}
    message = await refusal(core, pod)
    assert "limit" in message


async def live_config(api: client.ApiClient, spec: dict[str, Any]) -> None:
    await raw_json(
        client.CustomObjectsApi(api).create_cluster_custom_object(
            contract.CONFIG_GROUP,
            contract.CONFIG_VERSION,
            contract.CONFIG_PLURAL,
            {
                "apiVersion": f"{contract.CONFIG_GROUP}/{contract.CONFIG_VERSION}",
                "kind": contract.CONFIG_KIND,
                "metadata": {"name": contract.LIVE_CONFIG_NAME},
                "spec": spec,
            },
            _preload_content=False,
        )
    )


async def test_the_config_can_set_the_scheduler_name_and_keep_limits_in_units(
    core: client.CoreV1Api, api: client.ApiClient, operators: Any, admission: None
) -> None:
    operators()
    await ready(core)
    await live_config(api, {"setSchedulerName": True, "podMemoryLimits": "Units"})

    async def applied() -> dict[str, Any] | None:
        pod = gpu_pod("units", 2, scheduler="default-scheduler", nodeSelector={"none": "none"})
        try:
            return await create_pod(core, pod)
        except ApiError:
            return None

    created = await eventually(applied, timeout_s=20, what="the live configuration")
    assert created["spec"]["schedulerName"] == "volcano"
    assert limit(created) == "2"
    assert created["metadata"]["annotations"][contract.GPU_MEMORY_MIB] == "cuda-container=1024"


async def test_mixed_units_new_pods_go_to_nodes_of_the_cluster_unit_old_pods_keep_theirs(
    core: client.CoreV1Api, api: client.ApiClient, gpu_node: Any, operators: Any, webhook_port: int
) -> None:
    # Before the upgrade: a node at Volcano's 1 MiB, a pod written in MiB = units, no webhook.
    old = await gpu_node("old-node", "1x11178", unit_mib=1)
    operators("op-old")
    await create_pod(core, gpu_pod("legacy", 1024))
    await bound(core, "legacy")
    line = await asyncio.to_thread(old.kubelet.wait_started, "default/legacy", "cuda-container")
    assert line["envs"][contract.ENV_GPU_ALLOCATED] == "1024"
    # The upgrade: admission installed, a node at the cluster unit.
    await install_admission(api, webhook_url(webhook_port))
    new = await gpu_node("new-node", "1x11178", unit_mib=None)
    await ready(core)
    await create(core, gpu_pod("fresh", 1024))
    assert (await bound(core, "fresh"))["spec"]["nodeName"] == "new-node"
    line = await asyncio.to_thread(new.kubelet.wait_started, "default/fresh", "cuda-container")
    assert line["envs"][contract.ENV_GPU_ALLOCATED] == "1024"
    assert (await read_pod(core, "legacy"))["status"]["phase"] != "Failed"


def simulate(plane: ControlPlane, manifest: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(plane.kubeconfig)]
    return subprocess.run(
        [*argv, "simulate", "-f", str(manifest)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def test_simulate_reads_a_pod_as_the_webhook_would_store_it(
    plane: ControlPlane, gpu_node: Any, admission: None, tmp_path: Path
) -> None:
    await gpu_node("gpu-node-1", "1x11178", unit_mib=None)
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(gpu_pod("what-if", 1024)))
    shown = simulate(plane, manifest)
    assert shown.returncode == 0, shown.stderr
    # 21 devices of 512 MiB on the card, 2 taken by the pod's 1024 MiB.
    assert "would be placed now (bestfit): gpu-node-1 card 0 (9728 MiB" in shown.stdout
    manifest.write_text(yaml.safe_dump(gpu_pod("bad", "1Gi")))
    refused = simulate(plane, manifest)
    assert refused.returncode == 2
    assert "creating this pod would be refused" in refused.stderr
    assert "binary suffix" in refused.stderr

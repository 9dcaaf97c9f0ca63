"""The project on a real node: the kubelet built from the pinned module, containerd and runc,
the gpushare device plugin (fake cards) and the operator; kube-controller-manager and
kube-scheduler run beside the apiserver.

What a user sees is asserted: pod phase and reason, the env inside a running container
(`kubectl exec`), the device ids the kubelet writes into the pod's status, its checkpoint, and
the GPUNode status. One cluster serves the module (three real nodes: the guide's and one with
an 80 GiB card at 1 MiB per device, one at 64 MiB per device); each test removes its pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import pytest_asyncio
import yaml
from cluster import (
    create_pod,
    events_of,
    eventually,
    gpu_index,
    gpu_pod,
    read_pod,
    refused_rights,
    unschedulable,
)
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare.model.measured import container_of
from gpushare_harness import nodeteardown
from gpushare_harness.burst import BurstWatch, inventories, live_packing, model_packing
from gpushare_harness.crds import install_project_at
from gpushare_harness.identities import apply_roles, operator_kubeconfig, plugin_kubeconfig
from gpushare_harness.nodeconfig import FAKE_CDI_CARD, cdi_spec_dir, fake_cdi_spec
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.realnode import RealCluster, RealNode, RealNodeError, check_prerequisites
from gpushare_plugin.allocator import BYPASS_WAIT_S

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

EXAMPLES = Path(__file__).resolve().parents[4] / "manifests" / "examples"
GUIDE_CARD = 11178
SELECTED_ONLY = {"key": "gpushare.test/selected-only", "value": "true", "effect": "NoSchedule"}
COARSE_UNIT = contract.DEFAULT_MEMORY_UNIT_MIB  # the cluster's default unit
# One entry of a container's allocatedResourcesStatus ({"health": "Healthy", "resourceID":
# "7-11177"}) as `kubectl get pod -o json` prints it, five indented lines: at most this many
# bytes (about 170 for the guide's ids).
BYTES_PER_DEVICE_ID = 200
# The allocatedResourcesStatus entry around them (the resource's name) and the kubelet's
# managedFields entry for it, once per pod.
STATUS_OVERHEAD = 1024


@dataclass
class Node:
    real: RealNode
    plugin: PluginProcess
    unit: int


@dataclass
class Cluster:
    real: RealCluster
    kubeconfig: Path
    guide: Node
    coarse: Node
    wide: Node

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.real.plane is not None
        kubectl = self.real.plane.binaries.kubectl
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        check_prerequisites()
    except RealNodeError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    directory = tmp_path_factory.mktemp("real")
    cluster = RealCluster(directory)
    started: list[PluginProcess | OperatorProcess] = []
    try:
        cluster.start()
        assert cluster.plane is not None
        kubeconfig = cluster.plane.kubeconfig
        install_project_at(kubeconfig)
        apply_roles(cluster.plane.binaries.kubectl, kubeconfig)
        nodes = []
        for name, unit, cards in (
            ("gpu-node-1", 1, "8x11178"),  # the guide's node
            ("coarse-node", COARSE_UNIT, "1x81920,4x11178"),
            ("wide-node", 1, "1x81920"),
        ):
            # Only pods that ask for the other nodes go there: the guide's pods stay unchanged.
            taints = [] if name == "gpu-node-1" else [SELECTED_ONLY]
            node = cluster.add_node(name, kubelet_config={"registerWithTaints": taints})
            plugin = node.device_plugin(
                cards,
                directory / f"{name}-plugin.log",
                env={"GPU_MEMORY_FACTOR": str(unit)},
                kubeconfig=own_kubeconfig(
                    plugin_kubeconfig, kubeconfig, name, directory / f"{name}.kubeconfig"
                ),
            )
            started.append(plugin.start())
            nodes.append(Node(node, plugin, unit))
        operator = OperatorProcess(
            own_kubeconfig(operator_kubeconfig, kubeconfig, directory / "operator.kubeconfig"),
            directory / "operator.log",
        )
        started.append(operator.start())
        yield Cluster(cluster, kubeconfig, *nodes)
    finally:
        for process in reversed(started):
            process.stop()
        refused_rights(started)
        for name, node in cluster.nodes.items():  # kept for a failure's reader
            for log in ("kubelet.log", "containerd.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(node.directory / log, directory / f"{name}-{log}")
        cluster.stop()


def own_kubeconfig(make: Callable[..., Awaitable[Path]], admin: Path, *args: Any) -> Path:
    """A component's own kubeconfig (`identities`), from synchronous code."""

    async def made() -> Path:
        async with await kube.api_client(admin) as api:
            return await make(client.CoreV1Api(api), admin, *args)

    return asyncio.run(made())


@pytest_asyncio.fixture
async def core(real: Cluster) -> AsyncIterator[client.CoreV1Api]:
    """The default namespace's API; every pod a test made is deleted after it."""
    async with await kube.api_client(real.kubeconfig) as api:
        core = client.CoreV1Api(api)
        yield core
        await core.delete_collection_namespaced_pod("default", grace_period_seconds=0)

        async def gone() -> bool:
            listed = await raw_json(core.list_namespaced_pod("default", _preload_content=False))
            return not listed["items"]

        await eventually(gone, timeout_s=60, what="the test's pods to be deleted")


async def running(core: client.CoreV1Api, name: str, timeout_s: float = 60) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        pod = await read_pod(core, name)
        phase = pod["status"].get("phase")
        assert phase != "Failed", f"{name} failed: {pod['status']}"
        return pod if phase == "Running" else None

    return await eventually(probe, timeout_s=timeout_s, what=f"{name} Running")


async def exec_env(real: Cluster, pod: str, container: str | None = None) -> dict[str, str]:
    """The env a process in the running container sees (`kubectl exec POD -- env`); retried
    while a restarted kubelet has not yet synced the pod ("pod does not exist")."""
    args = ["exec", pod, *(["-c", container] if container else []), "--", "env"]

    async def attempt() -> subprocess.CompletedProcess[str] | None:
        result = await asyncio.to_thread(real.kubectl, *args, check=False)
        if result.returncode == 0:
            return result
        assert "pod does not exist" in result.stderr, result.stderr
        return None

    result = await eventually(attempt, what=f"kubectl exec {pod} -- env")
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def gpu_env(env: dict[str, str]) -> dict[str, str]:
    keys = (contract.ENV_VISIBLE_DEVICES, contract.ENV_GPU_ALLOCATED, contract.ENV_GPU_MEMORY_TOTAL)
    return {key: env[key] for key in keys if key in env}


def on(node: Node, name: str, mib: int, **spec: Any) -> dict[str, Any]:
    """A pod of `mib` MiB for `node`, its limit written in the node's unit."""
    selector = {"kubernetes.io/hostname": node.real.name}
    toleration = {**SELECTED_ONLY, "operator": "Equal"}
    return gpu_pod(
        name,
        math.ceil(mib / node.unit),
        nodeSelector=selector,
        tolerations=[toleration],
        **spec,
    )


def guide_env(card: str | None, allocated: int) -> dict[str, str]:
    assert card is not None
    return {
        contract.ENV_VISIBLE_DEVICES: card,
        contract.ENV_GPU_ALLOCATED: str(allocated),
        contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD),
    }


def device_ids(pod: dict[str, Any], container: str = "cuda-container") -> list[str]:
    """The gpu-memory device ids the kubelet wrote into the pod's status."""
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] == container:
            for resource in status.get("allocatedResourcesStatus", []):
                if resource["name"] == contract.GPU_MEMORY:
                    return [entry["resourceID"] for entry in resource["resources"]]
    return []


async def test_the_guides_pods_run_and_exec_shows_the_env_the_plugin_gave(
    real: Cluster, core: client.CoreV1Api
) -> None:
    for name in ("gpu-pod1", "gpu-pod2"):
        real.kubectl("apply", "-f", str(EXAMPLES / f"{name}.yaml"))  # the guide's, unchanged
    for name in ("gpu-pod1", "gpu-pod2"):
        pod = await running(core, name)
        assert pod["spec"]["nodeName"] == "gpu-node-1"
        assert gpu_index(pod) == "0"
        assert gpu_env(await exec_env(real, name)) == guide_env("0", 1024)
        # Kubernetes 1.36 writes every device id into the status (ResourceHealthStatus).
        ids = device_ids(pod)
        assert len(ids) == 1024
        assert all(i.startswith("0-") for i in ids)

    async def assigned() -> bool:
        pod = await read_pod(core, "gpu-pod2")
        return bool(pod["metadata"]["annotations"].get(contract.GPU_ASSIGNED) == "true")

    await eventually(assigned, what="gpu-assigned written by the plugin")


async def test_two_containers_and_an_init_container_each_see_their_share(
    real: Cluster, core: client.CoreV1Api
) -> None:
    shared = {"name": "shared", "mountPath": "/shared"}
    init = {
        "name": "warmup",
        "image": "nvidia/cuda:9.0-devel",
        "command": ["sh", "-c", "env > /shared/warmup.env"],
        "volumeMounts": [shared],
        "resources": {"limits": {contract.GPU_MEMORY: "512"}},
    }
    second = {
        "name": "second",
        "image": "nvidia/cuda:9.0-devel",
        "command": ["sleep", "100000"],
        "resources": {"limits": {contract.GPU_MEMORY: "2048"}},
    }
    body = gpu_pod("two", 1024, extra_containers=[second], initContainers=[init])
    body["spec"]["volumes"] = [{"name": "shared", "emptyDir": {}}]
    body["spec"]["containers"][0]["volumeMounts"] = [shared]
    await create_pod(core, body)
    pod = await running(core, "two")
    card = gpu_index(pod)
    assert gpu_env(await exec_env(real, "two", "cuda-container")) == guide_env(card, 1024)
    assert gpu_env(await exec_env(real, "two", "second")) == guide_env(card, 2048)
    warmup = real.kubectl("exec", "two", "-c", "cuda-container", "--", "cat", "/shared/warmup.env")
    init_env = dict(line.split("=", 1) for line in warmup.stdout.splitlines() if "=" in line)
    assert gpu_env(init_env) == guide_env(card, 512)
    assert len(device_ids(pod, "second")) == 2048


async def test_a_kubelet_restart_keeps_running_pods_and_admits_new_ones(
    real: Cluster, core: client.CoreV1Api
) -> None:
    # On the node of the default unit: at 1 MiB the restarted kubelet's device manager
    # holds admissions for a long time (measured in bench/realnode.py).
    node = real.coarse
    await create_pod(core, on(node, "before", 4096))
    before = await running(core, "before")
    env_before = gpu_env(await exec_env(real, "before"))
    container_before = before["status"]["containerStatuses"][0]["containerID"]
    mark = len(node.plugin.log_events())
    # From this thread: a child started from a worker thread dies with it (PDEATHSIG).
    node.real.restart_kubelet()
    await asyncio.to_thread(node.plugin.wait_logged, "re-registering", timeout_s=30, after=mark)
    await asyncio.to_thread(node.plugin.wait_registered, after=mark)
    # The running pod keeps its container, its card and its env.
    after = await running(core, "before")
    status = after["status"]["containerStatuses"][0]
    assert status["containerID"] == container_before
    assert status["restartCount"] == 0
    assert gpu_env(await exec_env(real, "before")) == env_before
    await create_pod(core, on(node, "after", 2048))
    pod = await running(core, "after")
    assert gpu_env(await exec_env(real, "after")) == guide_env(gpu_index(pod), 2048)


async def test_a_device_plugin_restart_keeps_pods_and_serves_new_ones(
    real: Cluster, core: client.CoreV1Api
) -> None:
    node = real.coarse
    await create_pod(core, on(node, "kept", 1024))
    await running(core, "kept")
    node.plugin.stop()
    node.plugin.start()
    assert (await read_pod(core, "kept"))["status"]["phase"] == "Running"
    await create_pod(core, on(node, "served", 3072))
    pod = await running(core, "served")
    assert gpu_env(await exec_env(real, "served")) == guide_env(gpu_index(pod), 3072)


async def test_with_volume_mounts_the_cards_are_named_by_mounts_a_pod_cannot_set(
    real: Cluster, core: client.CoreV1Api
) -> None:
    node = real.coarse
    node.plugin.stop()
    node.plugin.env["DEVICE_LIST_STRATEGY"] = "volume-mounts"
    try:
        node.plugin.start()
        await create_pod(core, on(node, "mounted", 1024))
        pod = await running(core, "mounted")
        card = gpu_index(pod)
        env = gpu_env(await exec_env(real, "mounted"))
        assert env[contract.ENV_VISIBLE_DEVICES] == "/var/run/nvidia-container-devices"
        listed = real.kubectl("exec", "mounted", "--", "ls", "/var/run/nvidia-container-devices")
        assert listed.stdout.split() == [card]
    finally:
        node.plugin.stop()
        del node.plugin.env["DEVICE_LIST_STRATEGY"]
        node.plugin.start()


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_with_cdi_the_runtime_applies_the_device_of_the_card_the_plugin_chose(
    real: Cluster, core: client.CoreV1Api, strategy: str
) -> None:
    node = real.coarse
    spec = cdi_spec_dir(node.real.directory) / "gpushare-fake.json"
    spec.write_text(fake_cdi_spec(5))  # the coarse node's five cards
    node.plugin.stop()
    node.plugin.env["DEVICE_LIST_STRATEGY"] = strategy
    try:
        node.plugin.start()
        name = f"by-{strategy}"
        await create_pod(core, on(node, name, 1024))
        pod = await running(core, name)
        env = await exec_env(real, name)
        # containerd applied the CDI device of the card the pod was placed on; no variable
        # names a card to a legacy NVIDIA hook.
        assert env[FAKE_CDI_CARD] == gpu_index(pod)
        assert env[contract.ENV_VISIBLE_DEVICES] == "void"
        assert env[contract.ENV_GPU_ALLOCATED] == "1024"
        inventory = await raw_json(
            client.CustomObjectsApi(core.api_client).get_cluster_custom_object(  # type: ignore[attr-defined]
                "gpushare.io", "v1alpha1", "gpunodes", node.real.name, _preload_content=False
            )
        )
        assert inventory["spec"]["deviceListStrategy"] == strategy
    finally:
        node.plugin.stop()
        del node.plugin.env["DEVICE_LIST_STRATEGY"]
        node.plugin.start()


def container_pids(pod: dict[str, Any]) -> dict[str, int]:
    """Each container's main process on the host, found as the plugin finds it: by the
    container its cgroup names."""
    ids = {
        status["containerID"].partition("://")[2]: status["name"]
        for status in pod["status"].get("containerStatuses", [])
    }
    found: dict[str, int] = {}
    for cgroup in Path("/proc").glob("[0-9]*/cgroup"):
        with contextlib.suppress(OSError):
            place = container_of(cgroup.read_text())
            name = place.container_in(ids) if place else None
            if name is not None:
                pid = int(cgroup.parent.name)
                found[name] = min(pid, found.get(name, pid))
    return found


async def test_what_containers_hold_is_measured_and_an_over_user_alone_is_warned_then_removed(
    real: Cluster, core: client.CoreV1Api, tmp_path: Path
) -> None:
    node = real.coarse
    cards = [{"memoryMiB": 81920}] + [{"memoryMiB": 11178}] * 4
    spec = tmp_path / "cards.yaml"
    spec.write_text(yaml.safe_dump({"cards": cards}))
    node.plugin.stop()
    inline = node.plugin.fake_gpus
    node.plugin.fake_gpus = f"@{spec}"
    node.plugin.env["GPUSHARE_USAGE_INTERVAL_SECONDS"] = "0.5"
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUShareConfig\nmetadata: {name: default}\n"
        "spec: {overUsePolicy: Warn, overUseGraceSeconds: 2}\n"
    )
    budget = tmp_path / "budget.yaml"
    budget.write_text(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: hog}\n"
        "spec: {minAvailable: 1, selector: {matchLabels: {app: hog}}}\n"
    )
    try:
        node.plugin.start()
        real.kubectl("apply", "-f", str(config))
        pods = {}
        for name in ("hog", "neighbour"):
            body = on(node, name, 1024)
            body["metadata"]["labels"] = {"app": name}
            await create_pod(core, body)
        for name in ("hog", "neighbour"):
            pods[name] = await running(core, name)
        held = {"hog": 3000, "neighbour": 800}  # the hog holds past its 1024 MiB
        processes = [
            {
                "pid": container_pids(pods[name])["cuda-container"],
                "card": int(str(gpu_index(pods[name]))),
                "usedMiB": mib,
            }
            for name, mib in held.items()
        ]
        spec.write_text(yaml.safe_dump({"cards": cards, "processes": processes}))

        async def measured() -> dict[str, tuple[int, int]] | None:
            body = await raw_json(
                client.CustomObjectsApi(core.api_client).get_cluster_custom_object(  # type: ignore[attr-defined]
                    "gpushare.io", "v1alpha1", "gpunodes", node.real.name, _preload_content=False
                )
            )
            found = {
                entry["pod"].partition("/")[2]: (entry["usedMiB"], entry["grantedMiB"])
                for card in body.get("status", {}).get("cards", [])
                for entry in card.get("containers", [])
            }
            return found if len(found) == len(held) else None

        assert await eventually(measured, timeout_s=30, what="the measured use in the status") == {
            "hog": (3000, 1024),
            "neighbour": (800, 1024),
        }

        async def warned(name: str, words: str) -> list[str] | None:
            events = await events_of(core, name)
            found = [e["message"] for e in events if e["reason"] == "GPUMemoryOverUse"]
            return found if any(words in message for message in found) else None

        (warning, *_) = await eventually(
            lambda: warned("hog", "holds 3000 MiB"), timeout_s=30, what="the over-use Event"
        )
        assert "was granted 1024 MiB there" in warning
        real.kubectl("apply", "-f", str(budget))
        real.kubectl(
            "patch", "gpushareconfig", "default", "--type", "merge",
            "-p", '{"spec": {"overUsePolicy": "Evict"}}',
        )  # fmt: skip
        await eventually(
            lambda: warned("hog", "Its PodDisruptionBudget refused the eviction"),
            timeout_s=30,
            what="the eviction refused by the PodDisruptionBudget",
        )
        assert (await read_pod(core, "hog"))["metadata"].get("deletionTimestamp") is None
        # The budget (a tenant may make one) would keep it for ever: the admin opts in to
        # deleting an over-user whose evictions were refused that long.
        real.kubectl(
            "patch", "gpushareconfig", "default", "--type", "merge",
            "-p", '{"spec": {"overUseDeleteAfterSeconds": 3}}',
        )  # fmt: skip

        async def evicted() -> bool:
            pod = await raw_json(
                core.list_namespaced_pod(
                    "default", field_selector="metadata.name=hog", _preload_content=False
                )
            )
            return not pod["items"] or bool(pod["items"][0]["metadata"].get("deletionTimestamp"))

        await eventually(evicted, timeout_s=40, what="the hog deleted past its budget")
        await eventually(
            lambda: warned("hog", "past overUseDeleteAfterSeconds: deleted"),
            timeout_s=30,
            what="the Event that says it was deleted",
        )
        neighbour = await read_pod(core, "neighbour")
        assert neighbour["status"]["phase"] == "Running"
        assert neighbour["metadata"].get("deletionTimestamp") is None
        assert not [e for e in await events_of(core, "neighbour") if "OverUse" in e["reason"]]
    finally:
        real.kubectl("delete", "-f", str(budget), "--ignore-not-found", check=False)
        real.kubectl("delete", "-f", str(config), "--ignore-not-found", check=False)
        node.plugin.stop()
        node.plugin.fake_gpus = inline
        del node.plugin.env["GPUSHARE_USAGE_INTERVAL_SECONDS"]
        node.plugin.start()


async def test_a_pod_of_higher_priority_evicts_the_cheapest_pod_its_budget_allows_and_runs(
    real: Cluster, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """The coarse node full (an 80 GiB card holding two 40 GiB pods, four 10.5 GiB cards one
    pod each); an 8 GiB pod of priority 1000 fits no card. The cheapest victim is card 3's
    pod (priority 0); while a PodDisruptionBudget protects it, card 4's (priority 50)."""
    node = real.coarse
    classes = tmp_path / "classes.yaml"
    classes.write_text(
        "".join(
            f"---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
            f"metadata: {{name: gpushare-test-{name}}}\nvalue: {value}\n"
            for name, value in (("high", 1000), ("mid", 100), ("low", 50))
        )
    )
    budget = tmp_path / "budget.yaml"
    budget.write_text(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: keep-c3}\n"
        "spec: {minAvailable: 1, selector: {matchLabels: {app: c3}}}\n"
    )
    real.kubectl("apply", "-f", str(classes))
    try:
        fill: list[tuple[str, int, str | None]] = [("big-1", 40960, "mid"), ("big-2", 40960, "mid")]
        fill += [("c1", 10752, "mid"), ("c2", 10752, "mid"), ("c3", 10752, None)]
        fill += [("c4", 10752, "low")]
        for name, mib, level in fill:
            body = on(node, name, mib, terminationGracePeriodSeconds=3)
            body["metadata"]["labels"] = {"app": name}
            if level:
                body["spec"]["priorityClassName"] = f"gpushare-test-{level}"
            await create_pod(core, body)
            await running(core, name)
        assert {name: gpu_index(await read_pod(core, name)) for name, _, _ in fill} == {
            "big-1": "0", "big-2": "0", "c1": "1", "c2": "2", "c3": "3", "c4": "4",
        }  # fmt: skip
        real.kubectl("apply", "-f", str(budget))

        async def preemptor(name: str) -> dict[str, Any]:
            body = on(node, name, 8192, terminationGracePeriodSeconds=3)
            body["spec"]["priorityClassName"] = "gpushare-test-high"
            await create_pod(core, body)

            async def nominated() -> bool:  # while its victim takes its grace period
                pod = await read_pod(core, name)
                return bool(pod["status"].get("nominatedNodeName") == node.real.name)

            await eventually(nominated, what=f"{name} nominated to {node.real.name}")
            return await running(core, name)

        first = await preemptor("h1")
        assert gpu_index(first) == "4"  # c3, cheaper, is protected by its budget
        real.kubectl("delete", "-f", str(budget))
        second = await preemptor("h2")
        assert gpu_index(second) == "3"
        assert gpu_env(await exec_env(real, "h2"))[contract.ENV_GPU_ALLOCATED] == "8192"

        # The preemptor runs once its victim's containers stopped (the pod is terminal); the
        # kubelet removes the victim's object a moment later.
        async def left() -> set[str] | None:
            listed = await raw_json(core.list_namespaced_pod("default", _preload_content=False))
            names = {p["metadata"]["name"] for p in listed["items"]}
            return names if names == {"big-1", "big-2", "c1", "c2", "h1", "h2"} else None

        await eventually(left, timeout_s=30, what="only the victims gone")
        for victim, by in (("c4", "h1"), ("c3", "h2")):
            messages = [
                e["message"] for e in await events_of(core, victim) if e["reason"] == "Preempted"
            ]
            assert messages == [
                f"Preempted by default/{by} (priority 1000) on node {node.real.name} card "
                f"{'4' if victim == 'c4' else '3'}"
            ]
    finally:
        real.kubectl("delete", "-f", str(budget), "--ignore-not-found", check=False)
        real.kubectl("delete", "-f", str(classes), "--ignore-not-found", check=False)


async def test_a_deployment_spread_across_cards_is_defragmented_and_the_waiting_pod_runs(
    real: Cluster, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """The coarse node (512 MiB units): the 80 GiB card full; four replicas of 4096 MiB one
    per small card (spacers placed them so, then went), each card 6656 MiB free. A pod of
    8192 MiB fits no card; `gpushare defrag --apply` moves one replica and it runs."""
    node = real.coarse
    deployment = tmp_path / "web.yaml"
    template = on(node, "web", 4096, terminationGracePeriodSeconds=1)
    template["metadata"] = {"labels": {"app": "web"}}
    deployment.write_text(
        json.dumps(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {
                    "replicas": 4,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": template["metadata"], "spec": template["spec"]},
                },
            }
        )
    )
    try:
        await create_pod(core, on(node, "full", 81920))
        await running(core, "full")
        for index in range(1, 5):  # one per small card, 4096 MiB left beside each
            await create_pod(core, on(node, f"spacer-{index}", 6656))
            assert gpu_index(await running(core, f"spacer-{index}")) == str(index)
        real.kubectl("apply", "-f", str(deployment))

        async def replicas() -> dict[str, str | None] | None:
            listed = await raw_json(
                core.list_namespaced_pod(
                    "default", label_selector="app=web", _preload_content=False
                )
            )
            cards = {
                p["metadata"]["name"]: gpu_index(p)
                for p in listed["items"]
                if p["status"].get("phase") == "Running"
            }
            return cards if len(cards) == 4 else None

        spread = await eventually(replicas, timeout_s=90, what="the four replicas running")
        assert sorted(map(str, spread.values())) == ["1", "2", "3", "4"]
        for index in range(1, 5):
            await core.delete_namespaced_pod(f"spacer-{index}", "default", grace_period_seconds=0)

        async def spacers_gone() -> bool | None:
            listed = await raw_json(core.list_namespaced_pod("default", _preload_content=False))
            names = {p["metadata"]["name"] for p in listed["items"]}
            return not any(name.startswith("spacer-") for name in names) or None

        # A spacer still terminating holds its card: the plan would move a replica elsewhere.
        await eventually(spacers_gone, timeout_s=60, what="the spacers gone")
        await create_pod(core, on(node, "big", 8192))
        assert "no card with enough free GPU memory" in await unschedulable(core, "big")

        shown = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "gpushare_cli",
                "--kubeconfig",
                str(real.kubeconfig),
                "defrag",
                "--apply",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        # One replica moves to another small card: the youngest (ties by card), which the
        # second its replicas were created in decides.
        planned = re.findall(
            r"  move default/(web-\S+) \(4096 MiB\) from coarse-node card (\d) to coarse-node "
            r"card (\d)",
            shown.stdout,
        )
        assert len(planned) == 1, shown.stdout
        moved, source, target = planned[0]
        assert spread[moved] == source
        assert target != source
        assert target in {"1", "2", "3", "4"}
        assert f"move 1/1: evicted default/{moved} from coarse-node card {source}" in shown.stdout
        assert "its replacement default/web-" in shown.stdout
        assert gpu_index(await running(core, "big", timeout_s=90)) == source
    finally:
        real.kubectl("delete", "-f", str(deployment), "--ignore-not-found", check=False)


async def test_deleting_a_pod_releases_its_devices_in_the_checkpoint_and_the_gpunode(
    real: Cluster, core: client.CoreV1Api
) -> None:
    node = real.coarse
    for name, mib in (("kept", 2048), ("deleted", 3072)):
        await create_pod(core, on(node, name, mib))
        await running(core, name)
    deleted_uid = (await read_pod(core, "deleted"))["metadata"]["uid"]
    await core.delete_namespaced_pod("deleted", "default", grace_period_seconds=0)

    async def gone() -> bool:
        listed = await raw_json(core.list_namespaced_pod("default", _preload_content=False))
        return all(p["metadata"]["name"] != "deleted" for p in listed["items"])

    await eventually(gone, what="the deleted pod to go")
    # The device manager drops a finished pod's devices at its next admission.
    await create_pod(core, on(node, "next", 512))
    await running(core, "next")

    def checkpoint_mib() -> dict[str, int]:
        data = json.loads(node.real.checkpoint.read_text())["Data"]
        held: dict[str, int] = {}
        for entry in data["PodDeviceEntries"] or []:
            if entry["ResourceName"] == contract.GPU_MEMORY:
                count = sum(len(ids) for ids in entry["DeviceIDs"].values())
                held[entry["PodUID"]] = held.get(entry["PodUID"], 0) + count * node.unit
        return held

    async def agreed() -> dict[str, Any] | None:
        gpunode = await raw_json(
            client.CustomObjectsApi(core.api_client).get_cluster_custom_object(  # type: ignore[attr-defined]
                "gpushare.io", "v1alpha1", "gpunodes", node.real.name, _preload_content=False
            )
        )
        held = checkpoint_mib()
        allocated = gpunode.get("status", {}).get("allocatedMiB")
        return gpunode if allocated == sum(held.values()) == 2048 + 512 else None

    await eventually(agreed, what="checkpoint and GPUNode status to agree on 2048 + 512 MiB")
    assert deleted_uid not in checkpoint_mib()


async def test_a_pod_that_bypasses_the_scheduler_is_refused_with_a_reason(
    real: Cluster, core: client.CoreV1Api
) -> None:
    # No admission policy in this cluster: the device plugin is the last line.
    bypass = gpu_pod("bypass", 1024, scheduler="default-scheduler", nodeName="gpu-node-1")
    logged = len(real.guide.plugin.log_events())
    await create_pod(core, bypass)

    async def failed() -> dict[str, Any] | None:
        pod = await read_pod(core, "bypass")
        return pod if pod["status"].get("phase") == "Failed" else None

    pod = await eventually(failed, timeout_s=60, what="the bypassing pod to be refused")
    # The kubelet admits one pod at a time: the refusal must not hold the node (it took
    # about 10 s while the plugin gave the watch its full grace twice): the short grace.
    graces = {
        e["grace_s"]
        for e in real.guide.plugin.log_events()[logged:]
        if e.get("event") == "watch_grace_over"
    }
    assert graces == {BYPASS_WAIT_S}
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "without volcano.sh/gpu-index" in pod["status"]["message"]


async def test_a_pod_with_a_local_volume_runs_where_the_volume_is_and_reads_it(
    real: Cluster, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """The operator gives a WaitForFirstConsumer claim the pre-provisioned local volume of
    wide-node (best-fit alone would choose gpu-node-1's smaller card); kube-controller-manager's
    PersistentVolume controller binds the two; the kubelet mounts the disk."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "hello").write_text("from the local disk\n")
    storage = client.StorageV1Api(cast(Any, core).api_client)
    local = {
        "metadata": {"name": "local-test"},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [real.wide.real.name]}
        ]
    }
    volume = {
        "metadata": {"name": "local-wide"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local-test",
            "local": {"path": str(disk)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
        },
    }
    claim = {
        "metadata": {"name": "scratch"},
        "spec": {
            "storageClassName": "local-test",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    await raw_json(storage.create_storage_class(cast(Any, local), _preload_content=False))
    await raw_json(core.create_persistent_volume(cast(Any, volume), _preload_content=False))
    await raw_json(
        core.create_namespaced_persistent_volume_claim(
            "default", cast(Any, claim), _preload_content=False
        )
    )
    try:
        toleration = {**SELECTED_ONLY, "operator": "Equal"}
        body = gpu_pod("with-disk", 1024, tolerations=[toleration])
        body["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "scratch"}}]
        body["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/disk"}]
        await create_pod(core, body)
        pod = await running(core, "with-disk", timeout_s=120)
        assert pod["spec"]["nodeName"] == real.wide.real.name
        read = real.kubectl("exec", "with-disk", "--", "cat", "/disk/hello")
        assert read.stdout == "from the local disk\n"
        bound = await raw_json(
            core.read_namespaced_persistent_volume_claim(
                "scratch", "default", _preload_content=False
            )
        )
        assert (bound["spec"]["volumeName"], bound["status"]["phase"]) == ("local-wide", "Bound")
    finally:
        await core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        with contextlib.suppress(kube.ApiError):
            await raw_json(
                core.delete_namespaced_persistent_volume_claim(
                    "scratch", "default", _preload_content=False
                )
            )
        with contextlib.suppress(kube.ApiError):
            await raw_json(core.delete_persistent_volume("local-wide", _preload_content=False))
        with contextlib.suppress(kube.ApiError):
            await raw_json(storage.delete_storage_class("local-test", _preload_content=False))


@pytest.mark.parametrize("mib", [1024, 16384])
async def test_the_pods_size_grows_with_its_device_ids_as_the_unit_makes_it(
    real: Cluster, core: client.CoreV1Api, mib: int
) -> None:
    sizes = {}
    for node in (real.wide, real.coarse):
        name = f"size-{node.unit}"
        limit = math.ceil(mib / node.unit)
        await create_pod(core, on(node, name, mib))
        await running(core, name)

        async def recorded(pod: str = name, count: int = limit) -> dict[str, Any] | None:
            found = await read_pod(core, pod)
            return found if len(device_ids(found)) == count else None

        await eventually(recorded, what=f"{limit} device ids in {name}'s status")
        text = real.kubectl("get", "pod", name, "-o", "json").stdout
        pod = json.loads(text)
        for status in pod["status"]["containerStatuses"]:
            status.pop("allocatedResourcesStatus", None)
        bare = len(json.dumps(pod, indent=4))  # kubectl's own indentation
        sizes[node.unit] = len(text.encode())
        assert sizes[node.unit] <= bare + STATUS_OVERHEAD + limit * BYTES_PER_DEVICE_ID
    assert sizes[1] - sizes[COARSE_UNIT] >= (mib - mib // COARSE_UNIT) * 100


async def test_pods_that_are_not_ours_are_made_placed_and_cleaned_up_by_the_control_plane(
    real: Cluster, core: client.CoreV1Api
) -> None:
    """kube-controller-manager makes a Deployment's pods, kube-scheduler places them, the
    kubelet runs them, and deleting their namespace removes them all."""
    real.kubectl("create", "namespace", "plain")
    real.kubectl(
        "create", "deployment", "plain", "-n", "plain", "--replicas=2",
        "--image=nvidia/cuda:9.0-devel", "--", "sleep", "100000",
    )  # fmt: skip

    async def both_running() -> list[dict[str, Any]] | None:
        listed = await raw_json(core.list_namespaced_pod("plain", _preload_content=False))
        pods = [p for p in listed["items"] if p["status"].get("phase") == "Running"]
        return pods if len(pods) == 2 else None

    pods = await eventually(both_running, timeout_s=60, what="the Deployment's two pods")
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["spec"]["nodeName"] == "gpu-node-1"  # the only node without a taint
        assert pod["spec"]["serviceAccountName"] == "default"  # the ServiceAccount plugin
    real.kubectl("delete", "namespace", "plain", "--wait=false")

    async def namespace_gone() -> bool:
        result = await asyncio.to_thread(real.kubectl, "get", "namespace", "plain", check=False)
        return "NotFound" in result.stderr

    await eventually(namespace_gone, timeout_s=90, what="the namespace and its pods to go")


async def test_the_kubelet_answers_only_authenticated_and_authorized_callers(
    real: Cluster,
) -> None:
    """No anonymous access to the kubelet's API; the apiserver's client certificate (exec,
    logs) and the admin's are authorized through the apiserver (webhook)."""
    await asyncio.to_thread(_kubelet_callers, real)


def _kubelet_callers(real: Cluster) -> None:
    plane = real.real.plane
    assert plane is not None
    assert plane.pki is not None
    url = f"https://{real.guide.real.address}:10250/pods"
    anonymous = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, context=anonymous, timeout=10)
    refused.value.close()
    assert refused.value.code == 401
    # The kubelet's serving certificate is for its InternalIP, signed by the cluster CA.
    admin = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    admin.load_cert_chain(str(plane.pki.admin_cert), str(plane.pki.admin_key))
    with urllib.request.urlopen(url, context=admin, timeout=10) as answer:
        assert json.loads(answer.read())["kind"] == "PodList"
    # A node's own identity may not read another node's kubelet.
    node = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    coarse = real.coarse.real.directory
    node.load_cert_chain(str(coarse / "kubelet-client.crt"), str(coarse / "kubelet-client.key"))
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        urllib.request.urlopen(url, context=node, timeout=10)
    forbidden.value.close()
    assert forbidden.value.code == 403


async def test_a_sweep_for_crashed_runs_leaves_running_nodes_alone(real: Cluster) -> None:
    """Every node start sweeps what crashed runs left: a running node (of this or another
    run) keeps its processes and its record, so a later crash of it is still cleaned up."""
    swept = nodeteardown.sweep()
    recorded = [entry.name for entry in nodeteardown.registry().glob("*.json")]
    for node in (real.guide, real.coarse, real.wide):
        assert node.real.name not in swept
        assert any(name.startswith(node.real.directory.name) for name in recorded)
        assert node.real.kubelet.running
        await asyncio.to_thread(node.real.wait_ready, timeout_s=30)


GROWTH_LIMIT = 16 * 1024
"""The most a pod's object may grow from its device ids at the default unit (the memory-unit
issue's target), whatever the pod asks of one card."""
RESTART_PODS = 100
RESTART_ADMISSION_S = 10.0


async def pod_bytes(real: Cluster, core: client.CoreV1Api, name: str) -> tuple[int, int]:
    """The pod's JSON as the apiserver sends it to every watcher (compact) and as `kubectl
    get -o json` prints it."""
    response = cast(
        aiohttp.ClientResponse,
        await core.read_namespaced_pod(name, "default", _preload_content=False),
    )
    async with response:
        compact = len(await response.read())
    return compact, len(real.kubectl("get", "pod", name, "-o", "json").stdout.encode())


async def test_at_the_default_unit_a_40_gib_pod_grows_by_at_most_16_kib(
    real: Cluster, core: client.CoreV1Api
) -> None:
    node = real.coarse
    sizes = {}
    for name, mib in (("small", COARSE_UNIT), ("large", 40960)):
        await create_pod(core, on(node, name, mib))
        await running(core, name)

        async def recorded(pod: str = name, count: int = mib // COARSE_UNIT) -> bool:
            return len(device_ids(await read_pod(core, pod))) == count

        await eventually(recorded, what=f"{name}'s device ids in its status")
        sizes[name] = await pod_bytes(real, core, name)
    compact = sizes["large"][0] - sizes["small"][0]
    printed = sizes["large"][1] - sizes["small"][1]
    assert 0 < compact <= printed <= GROWTH_LIMIT, sizes


async def test_after_a_kubelet_restart_with_100_gpu_pods_a_new_pod_is_admitted_within_10_s(
    real: Cluster, core: client.CoreV1Api
) -> None:
    node = real.coarse
    names = [f"busy-{i}" for i in range(RESTART_PODS)]
    for name in names:
        await create_pod(core, on(node, name, 1024))
    for name in names:
        await running(core, name, timeout_s=300)
    mark = len(node.plugin.log_events())
    node.real.restart_kubelet()
    await asyncio.to_thread(node.plugin.wait_registered, after=mark)
    created = time.monotonic()
    await create_pod(core, on(node, "newcomer", 1024))
    await running(core, "newcomer", timeout_s=120)
    waited = time.monotonic() - created
    assert waited <= RESTART_ADMISSION_S, f"admitted {waited:.1f} s after creation"


async def test_a_burst_of_same_size_pods_runs_each_on_the_card_its_annotation_names(
    real: Cluster, core: client.CoreV1Api
) -> None:
    names = [f"burst-{i:02d}" for i in range(15)]  # three cards' worth, five per card
    seen = BurstWatch("default", len(names))
    ready = asyncio.Event()
    async with await kube.api_client(real.kubeconfig) as api:
        watcher = asyncio.create_task(seen.run(api, ready))
        await ready.wait()
        try:
            await asyncio.gather(*(create_pod(core, on(real.guide, n, 2048)) for n in names))
            await asyncio.wait_for(seen.all_assigned.wait(), timeout=60)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        pods = [await running(core, name) for name in names]
        cluster = [i for i in await inventories(api) if i.node == real.guide.real.name]
    assert live_packing(cluster, pods).used == model_packing(cluster, seen.ordered(pods)).used
    for pod in pods:
        name = pod["metadata"]["name"]
        assert gpu_env(await exec_env(real, name)) == guide_env(gpu_index(pod), 2048)
        reasons = [e["reason"] for e in await events_of(core, name)]
        assert "FailedScheduling" not in reasons, name
    assert not seen.reported
    # The real kubelet's pod-resources records named the pod of every Allocate, and the
    # node's GPUNode told the operator so (pods of one size need not wait for each other).
    identified = {
        e["pod"]
        for e in real.guide.plugin.log_events()
        if e.get("event") == "container allocated" and e.get("identified")
    }
    assert identified >= {f"default/{n}" for n in names}
    assert [i.identifies_pods for i in cluster] == [True]

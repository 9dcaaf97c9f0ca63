"""Pods with PersistentVolumeClaims on a real apiserver, the operator on its own
ServiceAccount: a claim that waits for its first consumer is given the pod's node (or a
pre-provisioned volume there) and the pod is bound once the claim is; a bound claim's volume
decides the node; an unbound immediate claim keeps the pod waiting, said on it. The test plays
the provisioner and the PersistentVolume controller (the plane runs no controllers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from cluster import bound, create_pod, eventually, gpu_pod, read_pod, unschedulable
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model.volumes import BIND_COMPLETED, SELECTED_NODE
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_harness.operator import OperatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]


def claim(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def pod_with_claim(name: str, claim_name: str) -> dict[str, Any]:
    body = gpu_pod(name, 4000)
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return body


async def make_volume(
    core: client.CoreV1Api, name: str, node: str, claim_name: str, storage_class: str
) -> None:
    """A volume only `node` reaches, bound to the claim, as a provisioner and the PV controller
    leave them."""
    source = {"csi": {"driver": "disk.example.com", "volumeHandle": name}}
    claim_ref = {"namespace": "default", "name": claim_name}
    await create_volume(core, name, node, storage_class, {**source, "claimRef": claim_ref})
    await complete_binding(core, claim_name, name)


async def test_pods_with_claims_go_where_their_volumes_can_be(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    storage = client.StorageV1Api(api)
    for name, mode, provisioner in (
        ("waits", "WaitForFirstConsumer", "disk.example.com"),
        ("at-once", "Immediate", "disk.example.com"),
        ("local", "WaitForFirstConsumer", "kubernetes.io/no-provisioner"),
    ):
        body = {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}
        await raw_json(
            storage.create_storage_class(cast(client.V1StorageClass, body), _preload_content=False)
        )
    for node in ("n1", "n2"):
        await create_gpu_node(core, FakeGpuNode(name=node, gpu_memory=20000, gpu_number=1))
    for name, storage_class in (
        ("scratch", "waits"),
        ("zonal", "waits"),
        ("logs", "at-once"),
        ("nvme", "local"),
    ):
        await raw_json(
            core.create_namespaced_persistent_volume_claim(
                "default",
                cast(client.V1PersistentVolumeClaim, claim(name, storage_class)),
                _preload_content=False,
            )
        )
    await make_volume(core, "pv-zonal", "n2", "zonal", "waits")
    start_operator()

    # A bound claim: its volume reaches n2 alone.
    await create_pod(core, pod_with_claim("on-its-volume", "zonal"))
    assert (await bound(core, "on-its-volume"))["spec"]["nodeName"] == "n2"

    # A claim that waits for its first consumer: given the pod's node, the pod bound after it.
    await create_pod(core, pod_with_claim("provisioned", "scratch"))

    async def selected() -> str | None:
        body = await raw_json(
            core.read_namespaced_persistent_volume_claim(
                "scratch", "default", _preload_content=False
            )
        )
        return (body["metadata"].get("annotations") or {}).get(SELECTED_NODE)

    node = await eventually(selected, what="the claim's selected node")
    assert node in ("n1", "n2")
    assert (await read_pod(core, "provisioned"))["spec"].get("nodeName") is None
    await make_volume(core, "pv-scratch", node, "scratch", "waits")
    assert (await bound(core, "provisioned"))["spec"]["nodeName"] == node

    # An unbound claim of an Immediate class: the PV controller binds it first.
    await create_pod(core, pod_with_claim("waits-for-logs", "logs"))
    message = await unschedulable(core, "waits-for-logs")
    assert message.startswith("0/2 nodes are available: 2 pod has unbound immediate")
    await make_volume(core, "pv-logs", "n1", "logs", "at-once")
    assert (await bound(core, "waits-for-logs", timeout_s=90))["spec"]["nodeName"] == "n1"

    # A pre-provisioned local volume: the operator gives it to the claim, the pod follows it.
    await make_local_volume(core, "local-n1", "n1")
    await create_pod(core, pod_with_claim("on-local-disk", "nvme"))

    async def promised() -> dict[str, Any] | None:
        body = await raw_json(core.read_persistent_volume("local-n1", _preload_content=False))
        return body if body["spec"].get("claimRef") else None

    volume = await eventually(promised, what="the local volume's claimRef")
    assert (volume["spec"]["claimRef"]["namespace"], volume["spec"]["claimRef"]["name"]) == (
        "default",
        "nvme",
    )
    assert (await read_pod(core, "on-local-disk"))["spec"].get("nodeName") is None
    await complete_binding(core, "nvme", "local-n1")
    assert (await bound(core, "on-local-disk"))["spec"]["nodeName"] == "n1"


async def make_local_volume(core: client.CoreV1Api, name: str, node: str) -> None:
    """A pre-provisioned volume of class local on `node`, Available as the PersistentVolume
    controller marks it."""
    await create_volume(core, name, node, "local", {"local": {"path": f"/mnt/disks/{name}"}})
    await raw_json(
        core.patch_persistent_volume_status(
            name, {"status": {"phase": "Available"}}, _preload_content=False
        )
    )


async def create_volume(
    core: client.CoreV1Api, name: str, node: str, storage_class: str, spec: dict[str, Any]
) -> None:
    """A 1 GiB ReadWriteOnce volume of `storage_class` that only `node` reaches, with `spec`
    (its source, and a claimRef if any)."""
    term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]
    }
    volume = {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            **spec,
        },
    }
    await raw_json(
        core.create_persistent_volume(
            cast(client.V1PersistentVolume, volume), _preload_content=False
        )
    )


async def complete_binding(core: client.CoreV1Api, claim_name: str, volume: str) -> None:
    """What the PersistentVolume controller writes on a claim it has bound."""
    patch = {"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": volume}}
    await raw_json(
        core.patch_namespaced_persistent_volume_claim(
            claim_name, "default", patch, _preload_content=False
        )
    )

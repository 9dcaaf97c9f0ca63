"""Every Kubernetes API call the device plugin makes, in one place.

Reads: the pods bound to this node (one LIST, then a WATCH: never a LIST per Allocate) and the
Node itself (its UID, for the inventory's owner reference). Writes: `gpu-assigned` on a
pod the kubelet admitted (a patch with a UID precondition), the GPUNode inventory spec, and the
node's `volcano.sh/gpu-unhealthy-ids` annotation. Responses are read raw (see gpushare.kube).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.kube.reflector import ListCall
from gpushare.model import contract
from gpushare.model.usage import PodRef

_TIMEOUT_S = 10
COMPONENT = "gpushare-device-plugin"
"""Its user agent: the apiserver's audit log and the pods' managedFields name it so."""


class PluginApi:
    def __init__(self, api: client.ApiClient, *, timeout_s: float = _TIMEOUT_S) -> None:
        self._core = client.CoreV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self._timeout = timeout_s

    def pod_lister(self, node: str) -> ListCall:
        """The list (and watch) call of the pods bound to `node`, for a Reflector."""
        return functools.partial(
            self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )

    async def mark_assigned(self, pod: PodRef) -> None:
        """Set `gpu-assigned: "true"` on the pod `pod.uid` names (refused, 422, when it was
        replaced by a namesake)."""
        metadata: dict[str, Any] = {
            "uid": pod.uid,
            "annotations": {contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_TRUE},
        }
        patch = {"metadata": metadata}
        await raw_json(
            self._core.patch_namespaced_pod(
                pod.name,
                pod.namespace,
                patch,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def read_node(self, name: str) -> dict[str, Any]:
        return await raw_json(
            self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        )

    async def write_inventory(self, node: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
        """Create or update the node's GPUNode spec, owned by the Node (deleted with it)."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        }
        body = {
            "apiVersion": f"{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}",
            "kind": contract.INVENTORY_KIND,
            "metadata": {"name": meta.get("name"), "ownerReferences": [owner]},
            "spec": spec,
        }
        try:
            await raw_json(
                self._objects.create_cluster_custom_object(
                    contract.INVENTORY_GROUP,
                    contract.INVENTORY_VERSION,
                    contract.INVENTORY_PLURAL,
                    body,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
            return
        except ApiError as error:
            if error.status != 409:
                raise
        # It exists (an earlier run, or the Node was re-created): replace spec and owner.
        await raw_json(
            self._objects.patch_cluster_custom_object(
                contract.INVENTORY_GROUP,
                contract.INVENTORY_VERSION,
                contract.INVENTORY_PLURAL,
                name,
                [
                    {"op": "add", "path": "/spec", "value": spec},
                    {"op": "add", "path": "/metadata/ownerReferences", "value": [owner]},
                ],
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def heartbeat(self, node: str, stamp: str) -> None:
        """Set the node's GPUNode heartbeat annotation to `stamp`."""
        await self.annotate_gpunode(node, {contract.PLUGIN_HEARTBEAT: stamp})

    async def annotate_gpunode(self, node: str, annotations: Mapping[str, str]) -> None:
        """Set annotations of the node's GPUNode (a merge patch)."""
        await raw_json(
            self._objects.patch_cluster_custom_object(
                contract.INVENTORY_GROUP,
                contract.INVENTORY_VERSION,
                contract.INVENTORY_PLURAL,
                node,
                {"metadata": {"annotations": dict(annotations)}},
                # A merge patch: the client's default for custom objects is a JSON Patch.
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def set_unhealthy_ids(self, node: str, value: str | None) -> None:
        """Write (or, with None, remove) the node's `volcano.sh/gpu-unhealthy-ids`."""
        patch = {"metadata": {"annotations": {contract.GPU_UNHEALTHY_IDS: value}}}
        await raw_json(
            self._core.patch_node(
                node,
                patch,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

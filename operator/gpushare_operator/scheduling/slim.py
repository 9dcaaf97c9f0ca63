"""The fields of pods and nodes the scheduler keeps: the reflectors hand over these copies,
never the whole objects (a real node's status lists its images and managed fields, often tens
of KiB that no decision reads)."""

from __future__ import annotations

from typing import Any

from gpushare.model import contract
from gpushare.model.bodies import Body, annotations_of, path, sequence

_POD_METADATA = (
    "name",
    "namespace",
    "uid",
    "deletionTimestamp",
    "creationTimestamp",
    "resourceVersion",
    "labels",
)
_POD_SPEC = (
    "nodeName",
    "schedulerName",
    "containers",
    "initContainers",
    "overhead",
    "nodeSelector",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priority",
    "preemptionPolicy",
    "schedulingGates",
    "resources",
)
_POD_ANNOTATIONS = frozenset(
    {
        contract.GPU_INDEX,
        contract.PREDICATE_TIME,
        contract.GPU_ASSIGNED,
        contract.MEMORY_UNIT_MIB,
        contract.GPU_MEMORY_MIB,
    }
)
"""The annotations the scheduler reads of a pod; any others (a pod may carry 256 KiB of
them) are not kept: one copy per pod of the cluster lives in the cache."""
_CONTAINER = ("name", "resources", "restartPolicy")
_NODE_METADATA = ("name", "uid", "labels", "annotations", "resourceVersion")


def _pick(source: Body, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if key in source}


def _slim_container(container: Body) -> dict[str, Any]:
    """A container's name, resources and restart policy, and the ports it binds on the host."""
    kept = _pick(container, _CONTAINER)
    ports = [p for p in sequence(container.get("ports")) if p.get("hostPort")]
    if ports:
        kept["ports"] = [_pick(p, ("hostPort", "protocol")) for p in ports]
    return kept


def _slim_claim(volume: Body) -> dict[str, Any]:
    """A volume that names a PersistentVolumeClaim (or makes one: a generic ephemeral
    volume), kept for the claim's name alone; {} for any other volume."""
    claim = volume.get("persistentVolumeClaim")
    if isinstance(claim, dict):
        return {"name": volume.get("name"), "persistentVolumeClaim": _pick(claim, ("claimName",))}
    if isinstance(volume.get("ephemeral"), dict):
        return {"name": volume.get("name"), "ephemeral": {}}
    return {}


def slim_pod(body: Body) -> dict[str, Any]:
    """The fields of a pod the scheduler and the model read."""
    spec = path(body, "spec")
    slim_spec = _pick(spec, _POD_SPEC)
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            slim_spec[key] = [_slim_container(c) for c in spec[key] if isinstance(c, dict)]
    claims = [_slim_claim(v) for v in sequence(spec.get("volumes"))]
    if any(claims):
        slim_spec["volumes"] = [claim for claim in claims if claim]
    metadata = _pick(path(body, "metadata"), _POD_METADATA)
    annotations = {k: v for k, v in annotations_of(body).items() if k in _POD_ANNOTATIONS}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "metadata": metadata,
        "spec": slim_spec,
        "status": {
            "phase": path(body, "status").get("phase"),
            "startTime": path(body, "status").get("startTime"),
            # PodScheduled alone: whether a report changes the condition or only its message.
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in sequence(path(body, "status").get("conditions"))
                if c.get("type") == "PodScheduled"
            ],
        },
    }


def slim_node(body: Body) -> dict[str, Any]:
    """The fields of a node the filters and the inventory read."""
    status = path(body, "status")
    slim_status = _pick(status, ("allocatable", "capacity"))
    if "conditions" in status:
        slim_status["conditions"] = [
            {"type": c.get("type"), "status": c.get("status")}
            for c in sequence(status.get("conditions"))
        ]
    return {
        "metadata": _pick(path(body, "metadata"), _NODE_METADATA),
        "spec": _pick(path(body, "spec"), ("taints", "unschedulable")),
        "status": slim_status,
    }

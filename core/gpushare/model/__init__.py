"""The shared GPU-sharing model: pure, typed, synchronous, no I/O.

Dicts in (pod and node manifests, GPUNode specs), frozen dataclasses out. The operator, the
device plugin, the CLI and the benchmarks import it; none of them re-derives its rules. It
must never import asyncio, kopf, kubernetes_asyncio, grpc, pynvml, structlog or
prometheus_client (enforced by import-linter).
"""

from gpushare.model import contract
from gpushare.model.annotations import CardIndex, format_card_indices, parse_card_indices
from gpushare.model.diagnosis import (
    CardProblem,
    CardVerdict,
    Diagnosis,
    NodeProblem,
    NodeVerdict,
    diagnose,
)
from gpushare.model.errors import (
    GpuShareError,
    InvalidAnnotation,
    InvalidInventory,
    InvalidQuantity,
    InvalidRequest,
)
from gpushare.model.inventory import Card, InventorySource, NodeInventory, NodeName, node_inventory
from gpushare.model.placement import (
    CardCheck,
    NodeCheck,
    Placement,
    Policy,
    find_placement,
    place,
)
from gpushare.model.quantity import parse_quantity
from gpushare.model.request import (
    NO_GPU,
    ContainerRequest,
    GpuKind,
    PodRequest,
    gpu_request,
    pod_total,
)
from gpushare.model.usage import (
    Allocation,
    CardUsage,
    Ledger,
    NodeUsage,
    PodClaim,
    PodRef,
    PodUid,
    check_allocation,
    claim_of,
    pod_ref,
)

__all__ = [
    "NO_GPU",
    "Allocation",
    "Card",
    "CardCheck",
    "CardIndex",
    "CardProblem",
    "CardUsage",
    "CardVerdict",
    "ContainerRequest",
    "Diagnosis",
    "GpuKind",
    "GpuShareError",
    "InvalidAnnotation",
    "InvalidInventory",
    "InvalidQuantity",
    "InvalidRequest",
    "InventorySource",
    "Ledger",
    "NodeCheck",
    "NodeInventory",
    "NodeName",
    "NodeProblem",
    "NodeUsage",
    "NodeVerdict",
    "Placement",
    "PodClaim",
    "PodRef",
    "PodRequest",
    "PodUid",
    "Policy",
    "check_allocation",
    "claim_of",
    "contract",
    "diagnose",
    "find_placement",
    "format_card_indices",
    "gpu_request",
    "node_inventory",
    "parse_card_indices",
    "parse_quantity",
    "place",
    "pod_ref",
    "pod_total",
]

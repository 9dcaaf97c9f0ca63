"""What a user with rights in one namespace sees, completed from the GPUNodes.

Such a user may list their namespace's pods but not the others', nor nodes. The GPUNodes'
spec names the cards, and their status (written by the operator, which sees every pod) what
is allocated on each card and to whom. So:

- `stand_in_nodes`: a Node for each GPUNode, holding nothing but its name (its readiness,
  taints, labels and CPU/memory cannot be read, and are not checked: `report` asks no node
  filter of them);
- `stand_in_pods`: for each card, one bound gpu-memory pod holding what the card's status
  counts beyond the visible pods (a card held whole by a gpu-number pod shows as full), in
  the namespace `OTHERS`, which no real namespace can have. The scheduler's cache counts
  them as it counts any bound pod; they never move or get evicted (no controller, the
  highest priority).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from gpushare.model import GpuKind, GpuShareError, contract
from gpushare.model.bodies import Body, path, sequence, text
from gpushare.model.inventory import NodeName, inventory_from_spec
from gpushare.model.usage import claim_of

OTHERS = "(other namespaces)"
"""The namespace of the stand-in pods (parentheses: no namespace can be named so)."""
OTHERS_ANNOTATION = "gpushare.io/cli-stands-for"
"""On a stand-in pod: the pods the GPUNode's status lists on its card that are not visible,
comma-separated `namespace/name`."""
HIGHEST_PRIORITY = 2_000_000_000
"""Above any user's PriorityClass (system-node-critical is 2000001000): never a victim."""


def stand_in_nodes(gpunodes: Iterable[Body]) -> list[dict[str, Any]]:
    """A Node for each GPUNode: only its name, and Ready (not checked)."""
    return [
        {
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        for name in (text(path(g, "metadata").get("name")) for g in gpunodes)
        if name
    ]


def is_stand_in(pod: Body) -> bool:
    return path(pod, "metadata").get("namespace") == OTHERS


def stands_for(pod: Body) -> tuple[str, ...]:
    """The pods a stand-in pod counts for, as the GPUNode's status names them."""
    listed = (path(pod, "metadata").get("annotations") or {}).get(OTHERS_ANNOTATION) or ""
    return tuple(name for name in str(listed).split(",") if name)


def stand_in_pods(
    gpunodes: Iterable[Body], visible: Sequence[Body], scheduler: str
) -> list[dict[str, Any]]:
    """A bound pod per card for what its GPUNode's status counts there beyond the `visible`
    pods; none for a GPUNode whose spec cannot be read."""
    held: dict[tuple[str, int], int] = defaultdict(int)  # memory units the visible pods hold
    whole: set[tuple[str, int]] = set()
    seen: set[str] = set()
    for pod in visible:
        meta = path(pod, "metadata")
        seen.add(f"{meta.get('namespace')}/{meta.get('name')}")
        allocation = claim_of(pod).allocation
        if allocation is None:
            continue
        for card in allocation.cards:
            key = (str(allocation.node), int(card))
            if allocation.kind is GpuKind.NUMBER:
                whole.add(key)
            else:
                held[key] += allocation.amount
    pods: list[dict[str, Any]] = []
    for resource in gpunodes:
        name = text(path(resource, "metadata").get("name")) or ""
        try:
            inventory = inventory_from_spec(NodeName(name), path(resource, "spec"))
        except GpuShareError:
            continue
        if inventory is None:
            continue
        unit = inventory.unit_mib
        sizes = {int(card.index): card.memory for card in inventory.cards}
        for entry in sequence(path(resource, "status").get("cards")):
            index = entry.get("index")
            allocated = entry.get("allocatedMiB")
            if not isinstance(index, int) or index not in sizes or not isinstance(allocated, int):
                continue
            key = (name, index)
            if key in whole:
                continue
            others = tuple(
                str(p) for p in entry.get("pods") or () if isinstance(p, str) and p not in seen
            )
            units = -(-allocated // unit) - held[key]
            if units <= 0:
                continue
            pods.append(_stand_in(name, index, min(units, sizes[index]), others, scheduler))
    return pods


def _stand_in(
    node: str, card: int, units: int, others: tuple[str, ...], scheduler: str
) -> dict[str, Any]:
    annotations: dict[str, Any] = {
        contract.GPU_INDEX: str(card),
        contract.GPU_ASSIGNED: "true",
        OTHERS_ANNOTATION: ",".join(others),
    }
    return {
        "metadata": {
            "name": f"{node}-card-{card}",
            "namespace": OTHERS,
            "uid": f"stand-in/{node}/{card}",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "schedulerName": scheduler,
            "priority": HIGHEST_PRIORITY,
            "containers": [
                {"name": "others", "resources": {"limits": {contract.GPU_MEMORY: str(units)}}}
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        },
    }

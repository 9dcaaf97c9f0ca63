"""The status a GPUNode resource shows: what is allocated on each card, and to whom."""

from __future__ import annotations

from typing import Any

from gpushare.model.usage import NodeUsage


def gpunode_status(usage: NodeUsage) -> dict[str, Any]:
    """`status` of the node's GPUNode resource (MiB, pods as namespace/name)."""
    unit = usage.inventory.unit_mib
    cards = []
    for index, card in sorted(usage.cards.items()):
        cards.append(
            {
                "index": index,
                "healthy": card.card.healthy,
                "allocatedMiB": card.allocated * unit,
                "freeMiB": card.free * unit if card.shareable else 0,
                "pods": sorted(str(pod) for pod in card.pods.values()),
            }
        )
    return {
        "cardCount": len(cards),
        "healthyCards": sum(1 for c in cards if c["healthy"]),
        "allocatedMiB": sum(c["allocatedMiB"] for c in cards),
        "totalMiB": sum(c.card.memory for c in usage.cards.values()) * unit,
        "cards": cards,
    }

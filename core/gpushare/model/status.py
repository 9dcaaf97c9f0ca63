"""The status a GPUNode resource shows: what is allocated on each card, and to whom, whether
its device plugin is alive, and whether another device plugin hands out the same cards
(conditions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.model.bodies import Body, path
from gpushare.model.measured import MeasuredUsage
from gpushare.model.usage import NodeUsage


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat:
    """What the operator knows of a node's device plugin, at `now` (unix seconds)."""

    last: float | None
    """The plugin's last heartbeat; None when it has written none (a plugin too old)."""
    now: float
    stale_after_s: float


DOUBLE_ADVERTISED = "DoubleAdvertised"
_NVIDIA_PREFIX = "nvidia.com/"


def nvidia_resources(node: Body) -> dict[str, str]:
    """What the node advertises of NVIDIA's device plugin (`nvidia.com/gpu`, its MIG and
    shared variants), nonzero: those cards are handed out by it as well as by gpushare."""
    allocatable = path(node, "status").get("allocatable") or {}
    return {
        str(name): str(value)
        for name, value in sorted(allocatable.items())
        if str(name).startswith(_NVIDIA_PREFIX) and str(value) not in ("0", "")
    }


def double_advertised(node_name: str, nvidia: Mapping[str, str]) -> tuple[str, str, str]:
    """The DoubleAdvertised condition's status, reason and message."""
    if not nvidia:
        return ("False", "GpushareOnly", "no other device plugin advertises this node's cards")
    listed = ", ".join(f"{name}: {value}" for name, value in nvidia.items())
    return (
        "True",
        "NvidiaDevicePluginActive",
        f"node {node_name} also advertises {listed}: NVIDIA's device plugin hands out the "
        "cards gpushare shares, so a card can be given twice. Turn it off on gpushare's nodes "
        "(GPU Operator: label the node nvidia.com/gpu.deploy.device-plugin=false, or install "
        "it with devicePlugin.enabled=false; otherwise keep the nvidia-device-plugin "
        "DaemonSet off nodes labelled gpushare=true)",
    )


def gpunode_conditions(
    heartbeat: Heartbeat,
    healthy_cards: int,
    previous: Sequence[Mapping[str, Any]],
    stamp: str,
    double: tuple[str, str, str] | None = None,
) -> list[dict[str, Any]]:
    """`Ready` (the plugin is alive and a card is healthy), `Stale` (the plugin's heartbeat
    stopped) and, when given, `DoubleAdvertised` (`double_advertised`), as Kubernetes
    conditions: `lastTransitionTime` moves (to `stamp`) only when a condition's status
    changes. Messages never carry ages, so an unchanged state writes nothing."""
    if heartbeat.last is None:
        stale = ("Unknown", "NoHeartbeat", "the device plugin writes no heartbeat (too old?)")
    elif heartbeat.now - heartbeat.last > heartbeat.stale_after_s:
        stale = (
            "True",
            "HeartbeatStopped",
            f"no heartbeat from the device plugin for more than {heartbeat.stale_after_s:g} s: "
            f"is its pod running on the node?",
        )
    else:
        stale = ("False", "HeartbeatFresh", "the device plugin is running")
    if stale[0] != "False":
        ready = ("False" if stale[0] == "True" else "Unknown", stale[1], stale[2])
    elif healthy_cards == 0:
        ready = ("False", "NoHealthyCard", "every card is Unhealthy")
    else:
        ready = ("True", "PluginReady", f"{healthy_cards} healthy card(s) served")
    before = {str(c.get("type")): c for c in previous}
    conditions = []
    shown = [("Ready", ready), ("Stale", stale)]
    shown += [(DOUBLE_ADVERTISED, double)] if double is not None else []
    for kind, (status, reason, message) in shown:
        old = before.get(kind)
        since = stamp
        if old is not None and old.get("status") == status:
            since = str(old.get("lastTransitionTime") or stamp)
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since,
            }
        )
    return conditions


def gpunode_status(usage: NodeUsage, measured: MeasuredUsage | None = None) -> dict[str, Any]:
    """`status` of the node's GPUNode resource (MiB, pods as namespace/name), with what the
    device plugin last measured its cards' processes hold, when it has."""
    unit = usage.inventory.unit_mib
    cards: list[dict[str, Any]] = []
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
    status: dict[str, Any] = {
        "cardCount": len(cards),
        "healthyCards": sum(1 for c in cards if c["healthy"]),
        "allocatedMiB": sum(c["allocatedMiB"] for c in cards),
        "totalMiB": sum(c.card.memory for c in usage.cards.values()) * unit,
        "cards": cards,
    }
    if measured is not None:
        for entry in cards:
            uses = [use for use in measured.containers if use.card == entry["index"]]
            unmapped = measured.unmapped_mib.get(entry["index"], 0)
            entry["usedMiB"] = sum(use.used_mib for use in uses) + unmapped
            entry["unmappedMiB"] = unmapped
            entry["containers"] = [
                {
                    "pod": str(use.pod),
                    "container": use.container,
                    "usedMiB": use.used_mib,
                    **({} if use.granted_mib is None else {"grantedMiB": use.granted_mib}),
                }
                for use in uses
            ]
        status["usedMiB"] = sum(entry["usedMiB"] for entry in cards)
        status["measuredAt"] = measured.at
    return status

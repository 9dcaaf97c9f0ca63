"""The plugin's device table: the cards, the memory unit and each card's health.

ListAndWatch streams re-read it (see server): it has a version and a Condition, so a stream
sends the full list, then waits for a newer version; no per-stream queue, no lost update.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gpushare.model import contract
from gpushare.model.annotations import CardIndex, format_card_indices
from gpushare.model.device_list import DeviceListStrategy
from gpushare.model.devices import CardDevices, units_of
from gpushare.model.inventory import NodeInventory, NodeName, inventory_from_spec
from gpushare_plugin.discovery import DiscoveredCard


class DeviceTable:
    def __init__(
        self,
        *,
        node: str,
        cards: Sequence[DiscoveredCard],
        unit_mib: int,
        strategy: DeviceListStrategy = DeviceListStrategy.ENVVAR,
        serves: frozenset[str] = frozenset({contract.DEFAULT_SCHEDULER_NAME}),
    ) -> None:
        self.node = node
        self.cards = tuple(sorted(cards, key=lambda c: c.index))
        self.unit_mib = unit_mib
        self.strategy = strategy
        """How containers are told their cards: published, so that an admin sees which nodes
        let an image's or envFrom's NVIDIA_VISIBLE_DEVICES name cards (envvar)."""
        self.serves = serves
        """The pods' schedulerNames served: published, so that the operator places no pod of
        another here (the plugin would refuse its Allocate)."""
        self.identifies_pods = False
        """Whether the kubelet's pod-resources records say which pod each Allocate is for
        (read at start-up): published, so that the operator need not keep pods of one
        request on one card here."""
        self.version = 0
        self._unhealthy: frozenset[str] = frozenset()
        self._changed = asyncio.Condition()

    @property
    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the Unhealthy cards."""
        return self._unhealthy

    def healthy(self, card: DiscoveredCard) -> bool:
        return card.uuid not in self._unhealthy

    async def set_unhealthy(self, uuids: frozenset[str]) -> bool:
        """Replace the set of Unhealthy cards; whether anything changed (streams wake)."""
        if uuids == self._unhealthy:
            return False
        async with self._changed:
            self._unhealthy = uuids
            self.version += 1
            self._changed.notify_all()
        return True

    async def wait_newer(self, seen: int) -> int:
        """The version once it is newer than `seen`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version > seen)
            return self.version

    def sizes(self) -> list[CardDevices]:
        return [
            CardDevices(index=c.index, memory_mib=c.memory_mib, numa_node=c.numa_node)
            for c in self.cards
        ]

    def units(self, card: DiscoveredCard) -> int:
        return units_of(card.memory_mib, self.unit_mib)

    def unhealthy_indices(self) -> list[CardIndex]:
        return [c.index for c in self.cards if not self.healthy(c)]

    def unhealthy_ids_annotation(self) -> str | None:
        """The `volcano.sh/gpu-unhealthy-ids` value, None when every card is healthy."""
        return format_card_indices(self.unhealthy_indices()) or None

    def spec(self, plugin_version: str) -> dict[str, Any]:
        """The GPUNode spec this plugin publishes."""
        cards: list[dict[str, Any]] = []
        for card in self.cards:
            entry: dict[str, Any] = {
                "index": card.index,
                "uuid": card.uuid,
                "model": card.model,
                "memoryMiB": card.memory_mib,
                "health": contract.HEALTHY if self.healthy(card) else contract.UNHEALTHY,
            }
            if card.numa_node is not None:
                entry["numaNode"] = card.numa_node
            cards.append(entry)
        return {
            "cards": cards,
            "memoryUnitMiB": self.unit_mib,
            "pluginVersion": plugin_version,
            "identifiesPods": self.identifies_pods,
            "deviceListStrategy": self.strategy.value,
            "schedulerNames": sorted(self.serves),
        }

    def inventory(self) -> NodeInventory:
        """This node's cards as the shared model reads a GPUNode spec (one code path)."""
        inventory = inventory_from_spec(NodeName(self.node), self.spec(""))
        if inventory is None:  # discovery refuses to start without cards
            raise RuntimeError(f"node {self.node} has no GPU cards")
        return inventory

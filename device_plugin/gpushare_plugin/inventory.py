"""Publishes what the plugin found: the GPUNode spec (cards, unit, plugin version, health),
owned by the Node, and the node's `volcano.sh/gpu-unhealthy-ids` annotation; and, every
`--heartbeat-seconds`, that the plugin still runs (the GPUNode's heartbeat annotation, which
the operator turns into its `Ready` and `Stale` conditions)."""

from __future__ import annotations

import asyncio

import aiohttp

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import rfc3339
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.kubeapi import PluginApi


class InventoryPublisher:
    def __init__(self, *, api: PluginApi, table: DeviceTable, plugin_version: str) -> None:
        self._api = api
        self._table = table
        self._version = plugin_version
        self.dirty = True
        """The cluster may not show the table's current state: publish again."""
        self._log = logs.get("inventory", node=table.node)

    async def publish(self) -> bool:
        """Write spec and annotation; False (and still dirty) when the API refused."""
        node = self._table.node
        try:
            body = await self._api.read_node(node)
            await self._api.write_inventory(body, self._table.spec(self._version))
            await self._api.set_unhealthy_ids(node, self._table.unhealthy_ids_annotation())
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            hint = (
                " (does the Node exist? NODE_NAME must be spec.nodeName)"
                if isinstance(error, ApiError) and error.status == 404
                else ""
            )
            self._log.warning("publishing the GPU inventory failed", error=str(error) + hint)
            return False
        self.dirty = False
        self._log.info(
            "GPU inventory published",
            cards=len(self._table.cards),
            unit_mib=self._table.unit_mib,
            unhealthy=self._table.unhealthy_indices(),
        )
        return True

    async def heartbeat(self) -> bool:
        """Say that the plugin runs, now; False when the API refused (logged)."""
        try:
            await self._api.heartbeat(self._table.node, rfc3339())
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            self._log.warning("heartbeat failed", error=repr(error))
            return False
        return True


async def keep_beating(publisher: InventoryPublisher, interval_s: float) -> None:
    """The heartbeat, every `interval_s`, until cancelled."""
    while True:
        await publisher.heartbeat()
        await asyncio.sleep(interval_s)

"""Keeps each GPUNode resource's status current: per card, allocated MiB and pods; and the
`Ready` and `Stale` conditions from the device plugin's heartbeat.

Runs on the leader only; writes a node's status only when it changed since the last write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import parse_time, rfc3339
from gpushare.model import NodeName, contract
from gpushare.model.bodies import path
from gpushare.model.status import Heartbeat, gpunode_conditions, gpunode_status
from gpushare_operator.config import OperatorConfig
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.metrics import MIB, SchedulerMetrics
from gpushare_operator.scheduling.cache import SchedulerCache


class StatusWriter:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        api: SchedulerApi,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._cache = cache
        self._api = api
        self._metrics = metrics
        self._config = config
        self._written: dict[NodeName, dict[str, Any]] = {}
        self._log = logs.get("status")

    async def run(self) -> None:
        while True:
            await self.write_changed()
            await asyncio.sleep(self._config().status_interval_s)

    async def write_changed(self) -> None:
        for name in self._cache.gpunode_names():
            usage = self._cache.ledger.node(name)
            if usage is None:
                continue
            status = gpunode_status(usage)
            resource = self._cache.gpunode(name) or {}
            annotations = path(resource, "metadata").get("annotations") or {}
            now = self._clock()
            status["conditions"] = gpunode_conditions(
                Heartbeat(
                    last=parse_time(annotations.get(contract.PLUGIN_HEARTBEAT)),
                    now=now,
                    stale_after_s=self._config().plugin_stale_after_s,
                ),
                status["healthyCards"],
                # What the resource shows keeps its transition times across leaders.
                self._written.get(name, {}).get("conditions")
                or path(resource, "status").get("conditions")
                or [],
                rfc3339(now),
            )
            unit_bytes = usage.inventory.unit_mib * MIB
            for index, card in usage.cards.items():
                labels = (name, str(index))
                self._metrics.card_allocated_bytes.labels(*labels).set(card.allocated * unit_bytes)
                self._metrics.card_capacity_bytes.labels(*labels).set(card.card.total_mib * MIB)
            if self._written.get(name) == status:
                continue
            try:
                await self._api.patch_gpunode_status(name, status)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("status_write_failed", node=name, error=repr(error))
                continue
            self._written[name] = status

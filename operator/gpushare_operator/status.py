"""Keeps each GPUNode resource's status current: per card, allocated MiB and pods.

Runs on the leader only; writes a node's status only when it changed since the last write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.model import NodeName
from gpushare.model.status import gpunode_status
from gpushare_operator.config import OperatorConfig
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.scheduling.cache import SchedulerCache


class StatusWriter:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        api: SchedulerApi,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
    ) -> None:
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
            for card in status["cards"]:
                self._metrics.card_allocated_mib.labels(name, str(card["index"])).set(
                    card["allocatedMiB"]
                )
            if self._written.get(name) == status:
                continue
            try:
                await self._api.patch_gpunode_status(name, status)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("status_write_failed", node=name, error=repr(error))
                continue
            self._written[name] = status

"""Acting on over-use: the leader reads what each node's device plugin measured (its GPUNode's
`gpushare.io/measured-usage`) and carries out the live over-use policy
(`gpushare.model.overuse`): a Warning Event `GPUMemoryOverUse` on the pod of a container held
over its share for the grace period, and with `Evict` the pod evicted through the Eviction
API (its PodDisruptionBudgets decide: a refusal is said in an Event and tried again after
another grace period). Only the over-user's own pod is ever touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import parse_time
from gpushare.model.measured import measured_of
from gpushare.model.overuse import OverUse, OverUseWatch
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.kubeapi import Fenced, SchedulerApi
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.sweeps import in_slices

OVER_USE = "GPUMemoryOverUse"


class OverUseGuard:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        api: SchedulerApi,
        reporter: Reporter,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
        fence: WriteFence,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`fence`: asked before each eviction."""
        self._cache = cache
        self._fence = fence
        self._api = api
        self._reporter = reporter
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._watch = OverUseWatch()
        self._log = logs.get("overuse")

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._config().status_interval_s)

    async def check(self) -> None:
        """Judge every node's latest measurement once, and act on what is due."""
        config = self._config()
        now = self._clock()
        async for name in in_slices(self._cache.gpunode_names()):
            resource = self._cache.gpunode(name) or {}
            measured = measured_of(resource)
            actions = self._watch.observe(
                name,
                measured,
                measured_at=parse_time(measured.at) if measured else None,
                now=now,
                policy=config.over_use_policy,
                grace_s=config.over_use_grace_s,
                max_age_s=config.plugin_stale_after_s,
            )
            for action in actions:
                await self._act(action)

    async def _act(self, action: OverUse) -> None:
        pod = action.use.pod
        log = self._log.bind(pod=str(pod), node=action.node, card=action.use.card)
        if not action.evict:
            log.warning("over_use", container=action.use.container, message=action.message)
            self._reporter.event(pod, OVER_USE, action.message, warning=True)
            self._metrics.over_use.labels("warned").inc()
            return
        try:
            self._fence.check(f"evict {pod}")
            await self._api.evict(pod)
        except Fenced as fenced:
            self._watch.retry_later(action, self._clock())  # by the leader, whichever it is
            log.warning("over_use_eviction_fenced", error=str(fenced))
            return
        except (ApiError, OSError, TimeoutError) as error:
            if isinstance(error, ApiError) and error.status == 404:
                return  # gone already
            self._watch.retry_later(action, self._clock())
            grace = self._config().over_use_grace_s
            refusal = error.message if isinstance(error, ApiError) else repr(error)
            message = (
                f"{action.message}. Evicting it was refused ({refusal}: a "
                f"PodDisruptionBudget?); tried again in {grace:.0f} s"
            )
            log.warning("over_use_eviction_refused", error=refusal)
            self._reporter.event(pod, OVER_USE, message, warning=True)
            self._metrics.over_use.labels("eviction_refused").inc()
            return
        log.warning("over_use_evicted", container=action.use.container)
        self._reporter.event(pod, OVER_USE, f"{action.message}. Evicted", warning=True)
        self._metrics.over_use.labels("evicted").inc()

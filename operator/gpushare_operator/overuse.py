"""Acting on over-use: the leader reads what each node's device plugin measured (its GPUNode's
`gpushare.io/measured-usage`) and carries out the live over-use policy
(`gpushare.model.overuse`): a Warning Event `GPUMemoryOverUse` on the pod of a container held
over its share for the grace period, and with `Evict` the pod evicted through the Eviction
API (its PodDisruptionBudgets decide: a refusal is said in an Event and tried again after
another grace period; with overUseDeleteAfterSeconds, once its evictions were refused that long
the pod is deleted instead). Only the over-user's own pod is ever touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

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

    def _grace(self) -> float:
        return self._config().over_use_grace_s

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._config().status_interval_s)

    async def check(self) -> None:
        """Judge every node's latest measurement once, and act on what is due."""
        config = self._config()
        now = self._clock()
        judged: set[str] = set()
        async for name in in_slices(self._cache.gpunode_names()):
            judged.add(name)
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
                delete_after_s=config.over_use_delete_after_s,
            )
            for action in actions:
                await self._act(action)
        self._watch.keep_nodes(judged)

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
            # Tried again by the leader, whichever it is.
            self._watch.retry_later(action, self._clock(), after_s=self._grace())
            log.warning("over_use_eviction_fenced", error=str(fenced))
            return
        except (ApiError, OSError, TimeoutError) as error:
            status = error.status if isinstance(error, ApiError) else None
            if status in (404, 409):
                return  # gone already, or replaced by a namesake (the UID precondition)
            grace = self._grace()
            by_budget = _by_budget(error)
            if by_budget and action.delete:
                await self._delete(action, log)  # refused again, past overUseDeleteAfterSeconds
                return
            self._watch.retry_later(action, self._clock(), after_s=grace, by_budget=by_budget)
            message = f"{action.message}. {_eviction_refused(error)}; tried again in {grace:.0f} s"
            log.warning("over_use_eviction_refused", status=status, error=str(error))
            self._reporter.event(pod, OVER_USE, message, warning=True)
            self._metrics.over_use.labels("eviction_refused").inc()
            return
        log.warning("over_use_evicted", container=action.use.container)
        self._reporter.event(pod, OVER_USE, f"{action.message}. Evicted", warning=True)
        self._metrics.over_use.labels("evicted").inc()

    async def _delete(self, action: OverUse, log: FilteringBoundLogger) -> None:
        """Its PodDisruptionBudgets refused its evictions for the admin's
        overUseDeleteAfterSeconds, and once more now: deleted as it is (its UID the
        precondition), given the grace period to stop that an over-use has (a pod's own
        terminationGracePeriodSeconds could keep it over for hours)."""
        pod = action.use.pod
        refused_for = action.refused_for_s or 0.0
        try:
            self._fence.check(f"delete {pod}")
            await self._api.delete_pod(pod, grace_period_s=int(self._grace()))
        except Fenced as fenced:
            self._watch.retry_later(action, self._clock(), after_s=self._grace())
            log.warning("over_use_delete_fenced", error=str(fenced))
            return
        except (ApiError, OSError, TimeoutError) as error:
            status = error.status if isinstance(error, ApiError) else None
            if status in (404, 409):
                return  # gone already, or replaced by a namesake
            self._watch.retry_later(action, self._clock(), after_s=self._grace())
            log.warning("over_use_delete_failed", status=status, error=str(error))
            self._metrics.over_use.labels("delete_failed").inc()
            self._reporter.event(
                pod, OVER_USE, f"{action.message}. Deleting it failed ({error})", warning=True
            )
            return
        log.warning("over_use_deleted", container=action.use.container, refused_s=refused_for)
        message = (
            f"{action.message}. Its eviction was refused for {refused_for:.0f} s, past "
            "overUseDeleteAfterSeconds: deleted"
        )
        self._reporter.event(pod, OVER_USE, message, warning=True)
        self._metrics.over_use.labels("deleted").inc()


def _by_budget(error: ApiError | OSError | TimeoutError) -> bool:
    """Whether a PodDisruptionBudget refused the eviction: 429 for a budget that allows no
    disruption now, 500 for a pod that more than one budget selects. Other refusals (API
    Priority and Fairness' 429, an apiserver in trouble) say nothing of the budgets."""
    if not isinstance(error, ApiError) or error.status not in (429, 500):
        return False
    message = error.message.lower()
    return "disruption budget" in message or "disruptionbudget" in message


def _eviction_refused(error: ApiError | OSError | TimeoutError) -> str:
    """Why an eviction did not go, as the pod's Event says it."""
    if not isinstance(error, ApiError):
        return f"Evicting it failed: the apiserver did not answer ({error!r})"
    if _by_budget(error):
        return f"Its PodDisruptionBudget refused the eviction ({error.message})"
    if error.status == 403:
        return (
            f"Evicting it was forbidden ({error.message}): the operator's role needs "
            "create on pods/eviction (the chart's and the manifests' give it)"
        )
    return f"Evicting it was refused ({error.status}: {error.message})"

"""Keeps each GPUNode resource's status current: per card, allocated MiB and pods; and the
`Ready` and `Stale` conditions from the device plugin's heartbeat. And each PodGroup's: its
phase, member counts and (Volcano's) conditions, as `gangs.group_status` says: for the
PodGroups whose pods it schedules, and those with no pod yet when it serves the name
`volcano` (Volcano's job controller creates a job's pods only once its PodGroup is Inqueue;
beside Volcano's own scheduler, that one enqueues them).

Runs on the leader only; writes a node's status only when it changed since the last write,
and at most `--status-write-rate` writes a second: the status is a view (the scheduler never
reads it), so under a burst a node's status lags and each write covers several pods, instead
of a write per node every interval competing with the binds at the apiserver.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import parse_time, rfc3339
from gpushare.model import NodeName, contract
from gpushare.model.bodies import Body, path
from gpushare.model.gangs import group_status
from gpushare.model.measured import measured_of
from gpushare.model.status import (
    DOUBLE_ADVERTISED,
    Heartbeat,
    double_advertised,
    gpunode_conditions,
    gpunode_status,
    nvidia_resources,
)
from gpushare.model.usage import NodeUsage
from gpushare_operator.config import OperatorConfig
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.metrics import MIB, SchedulerMetrics
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.sweeps import in_slices


class StatusWriter:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        gangs: GangBook,
        api: SchedulerApi,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._cache = cache
        self._gangs = gangs
        self._api = api
        self._metrics = metrics
        self._config = config
        self._written: dict[NodeName, dict[str, Any]] = {}
        self._derived: dict[NodeName, _Derived] = {}
        self._next_write_at = 0.0  # monotonic: the pace of the writes
        self._log = logs.get("status")

    async def run(self) -> None:
        while True:
            await self.write_changed()
            await asyncio.sleep(self._config().status_interval_s)

    async def write_changed(self) -> None:
        await self._write_nodes()
        await self._write_groups()

    async def _write_groups(self) -> None:
        now = rfc3339(self._clock())
        served = self._config().scheduler_names
        for spec in self._gangs.specs():
            members = self._gangs.members(spec.key)
            if members and not any(self._cache.is_ours(pod) for pod in members):
                continue  # another scheduler's gang (Volcano's, beside us)
            if not members and contract.DEFAULT_SCHEDULER_NAME not in served:
                continue  # no pod yet: only a stand-in for Volcano's scheduler enqueues it
            status = group_status(spec, self._gangs.state(spec, self._cache), now)
            if {key: spec.status.get(key) for key in status} == status:
                continue
            await self._paced()
            try:
                await self._api.patch_podgroup_status(spec.key, status)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("status_write_failed", group=str(spec.key), error=repr(error))
                continue
            self._gangs.written(spec.key, status)

    async def _write_nodes(self) -> None:
        names = self._cache.gpunode_names()
        stamp, stale_after_s = _Stamp(), self._config().plugin_stale_after_s
        async for name in in_slices(names):
            usage, resource = self._cache.ledger.node(name), self._cache.gpunode(name)
            if usage is None or resource is None:
                continue
            derived, node = self._derived.get(name), self._cache.node(name)
            if derived is None or not derived.holds_for(usage, resource, node):
                derived = self._derive(name, usage, resource, node)
            now = self._clock()
            # What the resource shows keeps its transition times across leaders.
            previous = (
                self._written.get(name, {}).get("conditions")
                or path(resource, "status").get("conditions")
                or []
            )
            status = {
                **derived.status,
                "conditions": gpunode_conditions(
                    Heartbeat(last=derived.heartbeat, now=now, stale_after_s=stale_after_s),
                    derived.status["healthyCards"],
                    previous,
                    stamp.of(now),
                    derived.double,
                ),
            }
            if self._written.get(name) == status:
                continue
            await self._paced()
            try:
                await self._api.patch_gpunode_status(name, status)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("status_write_failed", node=name, error=repr(error))
                continue
            self._written[name] = status
            if derived.double[0] == "True" and _status_of(previous, DOUBLE_ADVERTISED) != "True":
                await self._warn_node(name, derived.double[2])
        for gone in self._derived.keys() - set(names):
            self._derived.pop(gone)
            self._written.pop(gone, None)

    def _derive(
        self, name: NodeName, usage: NodeUsage, resource: Body, node: Body | None
    ) -> _Derived:
        """What the node's status is made of, but its conditions' times; and its cards'
        metrics, which change only with it."""
        annotations = path(resource, "metadata").get("annotations") or {}
        derived = _Derived(
            usage=usage,
            revision=usage.revision,
            resource=resource,
            node=node,
            status=gpunode_status(usage, measured_of(resource)),
            heartbeat=parse_time(annotations.get(contract.PLUGIN_HEARTBEAT)),
            double=double_advertised(name, nvidia_resources(node or {})),
        )
        self._derived[name] = derived
        unit_bytes = usage.inventory.unit_mib * MIB
        for index, card in usage.cards.items():
            labels = (name, str(index))
            self._metrics.card_allocated_bytes.labels(*labels).set(card.allocated * unit_bytes)
            self._metrics.card_capacity_bytes.labels(*labels).set(card.card.total_mib * MIB)
        return derived

    async def _warn_node(self, name: NodeName, message: str) -> None:
        """One Warning on the Node (`kubectl describe node`) when it turns double-advertised."""
        try:
            await self._api.post_node_event(
                name, event_type="Warning", reason=DOUBLE_ADVERTISED, message=message
            )
        except (ApiError, OSError, TimeoutError) as error:
            self._log.warning("node_event_failed", node=name, error=repr(error))

    async def _paced(self) -> None:
        """Wait for this write's turn at `status_write_rate` writes a second. The next turn
        counts from when this one came, not when it was due: a loop that woke late (a busy
        machine) would otherwise catch up with writes back to back."""
        now = time.monotonic()
        if self._next_write_at > now:
            await asyncio.sleep(self._next_write_at - now)
        self._next_write_at = time.monotonic() + 1 / self._config().status_write_rate


def _status_of(conditions: Any, kind: str) -> str | None:
    return next((str(c.get("status")) for c in conditions if c.get("type") == kind), None)


@dataclass(frozen=True, slots=True)
class _Derived:
    """A node's status but its conditions, from its usage at one revision, its GPUNode
    resource and its Node as the cache held them (the cache replaces a body it sees again)."""

    usage: NodeUsage
    revision: int
    resource: Body
    node: Body | None
    status: dict[str, Any]
    heartbeat: float | None
    double: tuple[str, str, str]

    def holds_for(self, usage: NodeUsage, resource: Body, node: Body | None) -> bool:
        return (
            self.usage is usage
            and self.revision == usage.revision
            and self.resource is resource
            and self.node is node
        )


class _Stamp:
    """`rfc3339` of a time, formatted once per second of a sweep."""

    def __init__(self) -> None:
        self._second: int | None = None
        self._text = ""

    def of(self, at: float) -> str:
        if int(at) != self._second:
            self._second, self._text = int(at), rfc3339(at)
        return self._text

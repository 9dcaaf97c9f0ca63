"""The operator's parts wired together, and their life cycle, independent of kopf (its
handlers only start and stop a Runtime, probe it and hand it the live configuration).

`Runtime` builds the cache, the queue, the intake (which every event goes through), the
scheduler, the status writer, the labeller and the elector, points the reflectors (nodes,
GPUNodes, pods, PodGroups, PriorityClasses, PodDisruptionBudgets, PersistentVolumeClaims,
PersistentVolumes, StorageClasses) at the intake, and runs the long-running tasks
under one supervision: the reflectors, the intake's findings and the elector always; the
decision loop, the status writer and the labeller only while this replica leads (or always,
with leader election off).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gpushare import logs
from gpushare.kube.reflector import DELETED, Reflector, name_of
from gpushare.model import contract
from gpushare.model.bodies import Body, path, text
from gpushare.model.gangs import GroupApi
from gpushare.model.volumes import claim_facts, class_facts, volume_facts
from gpushare_operator.config import ConfigError, OperatorConfig, describe, with_live
from gpushare_operator.defragmenter import Defragmenter
from gpushare_operator.election import LeaseElector, WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.labeller import Labeller
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.overuse import OverUseGuard
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.queue import SchedulingQueue
from gpushare_operator.scheduling.slim import slim_node
from gpushare_operator.status import StatusWriter


def release_memory() -> None:
    """Give the memory of a large LIST back to the system. The raw JSON of every pod is
    garbage once the cache holds its slim copy, but glibc keeps freed heap pages mapped;
    malloc_trim returns them (a no-op where glibc is absent). What survives is the cache as
    listed, most of it (nodes, bound pods) long-lived: frozen, the collector no longer walks it
    (a full collection of a 5,000-node cache held the event loop for 0.23 s in a burst of
    binds). Objects of it that die later are still freed (no cycles among them), only a cycle
    that was alive then is never collected."""
    gc.collect()
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _namespaced_name(item: Body) -> str:
    meta = path(item, "metadata")
    return f"{text(meta.get('namespace'))}/{text(meta.get('name'))}"


@dataclass(frozen=True)
class ConfigVerdict:
    """What a GPUShareConfig's status says: whether its spec was applied, why not, and the
    spec in force now (None: the environment's values alone)."""

    accepted: bool
    message: str
    in_force: Body | None = None


class Runtime:
    """Every component reads the live configuration the same way: through `current_config`,
    at the moment it needs a value (a GPUShareConfig change replaces `config`, nothing else)."""

    def __init__(
        self,
        *,
        config: OperatorConfig,
        api: SchedulerApi,
        on_failure: Callable[[], None],
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        """`on_failure`: called once when one of its tasks ends with an error nothing handled
        (a bug): the operator stops, to be started again clean, rather than go on leading
        with its decision loop or its Lease renewal dead."""
        self._on_failure = on_failure
        self.failure: str | None = None
        self.base_config = config
        self.config = config
        self._live_spec: Body | None = None
        self.api = api
        self.metrics = metrics or SchedulerMetrics()
        self.cache = SchedulerCache(config=self.current_config)
        self.queue = SchedulingQueue(config=self.current_config)
        self.gangs = GangBook()
        self.reporter = Reporter(api)
        fence = self.fence = WriteFence(self._may_write, lambda: self.elector.term)
        self.labeller = Labeller(
            api=api, fence=fence, binds=lambda pod: pod.node is None and self.cache.is_ours(pod)
        )
        self.intake = Intake(
            cache=self.cache,
            queue=self.queue,
            gangs=self.gangs,
            reporter=self.reporter,
            labeller=self.labeller,
        )
        self.scheduler = Scheduler(
            cache=self.cache,
            queue=self.queue,
            gangs=self.gangs,
            api=api,
            reporter=self.reporter,
            metrics=self.metrics,
            config=self.current_config,
            findings=self.intake.findings,
            volume_changes=self.intake.volume_changes,
            fence=fence,
        )
        self.status = StatusWriter(
            cache=self.cache,
            gangs=self.gangs,
            api=api,
            metrics=self.metrics,
            config=self.current_config,
        )
        self.over_use = OverUseGuard(
            cache=self.cache,
            api=api,
            reporter=self.reporter,
            metrics=self.metrics,
            config=self.current_config,
            fence=fence,
        )
        self.defragmenter = Defragmenter(
            cache=self.cache,
            gangs=self.gangs,
            api=api,
            reporter=self.reporter,
            metrics=self.metrics,
            config=self.current_config,
            fence=fence,
        )
        self.elector = LeaseElector(
            api,
            config=self.current_config,
            on_started_leading=self._start_leading,
            on_stopped_leading=self._stop_leading,
        )
        intake = self.intake
        self._pods = Reflector(
            "pods",
            api.lister("pods"),
            transform=PodInfo.parse,
            on_event=intake.pod_event,
            on_listed=intake.listed_pods,
        )
        nodes = Reflector(
            "nodes",
            api.lister("nodes"),
            transform=slim_node,
            on_event=intake.node_event,
            on_listed=intake.listed_nodes,
            key=name_of,
        )
        gpunodes = Reflector(
            "gpunodes",
            api.lister("gpunodes"),
            transform=dict,
            on_event=intake.gpunode_event,
            on_listed=intake.listed_gpunodes,
            key=name_of,
            optional=True,
        )
        # PodGroups before pods, so that a gang's members are never taken for single pods.
        groups = tuple(
            Reflector(
                f"podgroups.{group_api.group}",
                api.lister(group_api.name),
                transform=dict,
                on_event=functools.partial(intake.group_event, group_api),
                on_listed=functools.partial(intake.listed_groups, group_api),
                key=_namespaced_name,
                optional=True,
            )
            for group_api in GroupApi
        )
        priority_classes = Reflector(
            "priorityclasses",
            api.lister("priorityclasses"),
            transform=dict,
            on_event=intake.priority_class_event,
            on_listed=intake.listed_priority_classes,
            key=name_of,
            optional=True,
        )
        budgets = Reflector(
            "poddisruptionbudgets",
            api.lister("poddisruptionbudgets"),
            transform=dict,
            on_event=intake.budget_event,
            on_listed=intake.listed_budgets,
            key=_namespaced_name,
            optional=True,
        )
        # Volumes before pods too: a pod's claims are judged as soon as it is seen.
        volumes = (
            Reflector(
                "storageclasses",
                api.lister("storageclasses"),
                transform=class_facts,
                on_event=intake.class_event,
                on_listed=intake.listed_classes,
                key=name_of,
            ),
            Reflector(
                "persistentvolumes",
                api.lister("persistentvolumes"),
                transform=volume_facts,
                on_event=intake.volume_event,
                on_listed=intake.listed_volumes,
                key=name_of,
            ),
            Reflector(
                "persistentvolumeclaims",
                api.lister("persistentvolumeclaims"),
                transform=claim_facts,
                on_event=intake.claim_event,
                on_listed=intake.listed_claims,
                key=_namespaced_name,
            ),
        )
        self.reflectors: tuple[Reflector[Any], ...] = (
            nodes,
            gpunodes,
            priority_classes,
            budgets,
            *volumes,
            *groups,
            self._pods,
        )
        self._leader_written: tuple[Reflector[Any], ...] = (*volumes[1:], *groups, self._pods)
        """What a leader writes and decides by (Bindings, evictions and conditions on pods;
        PodGroups' status; a claim's node, a volume's claim): a LIST of
        it that began before a leadership may lack the last writes of the leader before. Of
        the other kinds a leader writes only GPUNodes' status,
        which no decision reads (it is read back for its conditions' times alone)."""
        self.synced = asyncio.Event()
        self.started_at = time.monotonic()
        self._leader_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._log = logs.get("operator", identity=config.identity)

    def current_config(self) -> OperatorConfig:
        return self.config

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._log.info("starting", config=describe(self.config))
        self.spawn(self.initial_sync(), "initial sync")
        self.spawn(self.intake.take_findings(), "findings")
        if self.config.leader_elect:
            self.spawn(self.elector.run(), "elector")
        else:
            self._start_leading()

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` until the operator stops."""
        self._tasks.append(self._supervised(work, name))

    def _supervised(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._task_ended)
        return task

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self.failure is not None:
            return
        error = task.exception()
        self.failure = f"{task.get_name()}: {error!r}"
        self._log.error(
            "task_failed",
            task=task.get_name(),
            error=repr(error),
            exc_info=error,
            consequence="the operator stops; its Deployment starts it again and the standby "
            "replica takes over the Lease",
            fix="report this with the log line: it is a bug",
        )
        self._on_failure()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._cancel_leader_tasks()  # before the reflectors: a relist may be under way
        for reflector in self.reflectors:
            await reflector.stop()
        if self.config.leader_elect:
            with contextlib.suppress(Exception):  # best effort on the way out
                await self.elector.release()

    @property
    def leading(self) -> bool:
        return self.elector.leading or not self.config.leader_elect

    def _may_write(self) -> bool:
        return not self.config.leader_elect or self.elector.fresh()

    def _start_leading(self) -> None:
        self.metrics.leader.set(1)
        self._leader_tasks = [
            self._supervised(self._lead(time.monotonic()), "leader"),
            self._supervised(self.reporter.run(), "reporter"),
        ]

    def _stop_leading(self) -> None:
        self.metrics.leader.set(0)
        for task in self._leader_tasks:
            task.cancel()

    async def _cancel_leader_tasks(self) -> None:
        self._stop_leading()
        await asyncio.gather(*self._leader_tasks, return_exceptions=True)
        self._leader_tasks = []

    async def _lead(self, since: float) -> None:
        """The leader's work, once the cache is current. A standby's watches may lag behind
        what the previous leader bound (an apiserver restart breaks them for a while), and a
        decision on a stale cache can overcommit a card: so a new leader lists what a leader
        writes again first, unless that was listed after the leadership began."""
        await self.synced.wait()
        if self.config.leader_elect:
            await self._list_led_again(since)
        async with asyncio.TaskGroup() as work:
            work.create_task(self.scheduler.run(), name="scheduler")
            work.create_task(self.status.run(), name="status")
            work.create_task(self.over_use.run(), name="over-use")
            work.create_task(self.defragmenter.run(), name="defragmenter")
            work.create_task(self.labeller.run(), name="labeller")

    # -- feeding the cache ---------------------------------------------------------------

    async def initial_sync(self) -> None:
        """Start the reflectors one kind after another (nodes first, so that pods land on
        known nodes; one large list at a time), then open the leader's work. What a leader
        writes is listed once the elector's first round has decided: a replica that leads
        from the start then lists it once, not twice."""
        for reflector in self.reflectors:
            if self.config.leader_elect and reflector in self._leader_written:
                await self.elector.decided.wait()
            reflector.start()
            await reflector.synced.wait()
        release_memory()
        self.synced.set()
        self._log.info(
            "synced",
            nodes=len(self.cache.node_names()),
            pods=self._pods.count,
            pending=len(self.cache.pending_uids()),
        )

    async def _list_led_again(self, since: float) -> None:
        """LIST again, one kind after another, what a leader writes and was last listed
        before `since` (monotonic); return once the cache holds it."""
        stale = [reflector for reflector in self._leader_written if reflector.listed_from < since]
        for reflector in stale:
            await reflector.relist()
        if stale:
            self._log.info(
                "resynced", kinds=[reflector.resource for reflector in stale], pods=self._pods.count
            )

    # -- live configuration --------------------------------------------------------------

    async def apply_config(
        self, event_type: str, name: str, spec: Body, in_force: Body | None = None
    ) -> ConfigVerdict:
        """Apply a GPUShareConfig; what its status says. `in_force`: the spec its status says
        was in force (`status.inForce`, this operator's own record): taken when this replica
        has applied none yet and `spec` is refused, so that a restart keeps the last spec
        accepted."""
        live = contract.LIVE_CONFIG_NAME
        if name != live:
            return ConfigVerdict(False, f"ignored: only the GPUShareConfig named {live!r} is read")
        if event_type == DELETED:
            await self._configure(self.base_config, None)
            return ConfigVerdict(True, "deleted: the environment's values are in force")
        try:
            config = with_live(self.base_config, spec)
        except ConfigError as error:
            self._log.warning("config_refused", error=str(error))
            if self._live_spec is None and in_force is not None:
                # Refused too (the environment changed since): the environment's values stand.
                with contextlib.suppress(ConfigError):
                    await self._configure(with_live(self.base_config, in_force), in_force)
            stays = (
                "the environment's values are in force (no spec accepted before is on record)"
                if self._live_spec is None
                else "the spec accepted before (status.inForce) stays in force"
            )
            return ConfigVerdict(False, f"{error}; {stays}", self._live_spec)
        await self._configure(config, spec)
        return ConfigVerdict(True, "applied", spec)

    async def _configure(self, config: OperatorConfig, spec: Body | None) -> None:
        """Run on `config` from now on, `spec` the live spec it was made from (None: the
        environment's alone)."""
        self._live_spec = spec
        names_changed = config.scheduler_names != self.config.scheduler_names
        self.config = config
        if names_changed:
            # Pods of a newly served (or dropped) scheduler name wait unbound: look again
            # (also when the first list is under way; before it starts, it will see them).
            await self._pods.relist()
        self._log.info("config_applied", config=describe(config))

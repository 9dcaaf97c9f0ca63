"""The operator's parts wired together, independent of kopf (its handlers only start and
stop a Runtime, probe it and hand it the live configuration).

`Runtime` owns the reflectors that keep the cache current (nodes, GPUNodes, pods), the
cache, the queue, the scheduler, the status writer and the elector, and the long-running
tasks: the reflectors and the elector always run; the decision loop and the status writer
run only while this replica leads (or always, with leader election off).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gpushare import logs
from gpushare.kube.reflector import DELETED, Reflector, name_of
from gpushare.model import NodeName, PodUid, contract
from gpushare.model.bodies import Body, path, resource_version, text
from gpushare.model.gangs import GroupApi, group_key
from gpushare_operator.config import ConfigError, OperatorConfig, describe, with_live
from gpushare_operator.election import LeaseElector
from gpushare_operator.kubeapi import SchedulerApi
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.cache import PodChange, SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.queue import SchedulingQueue
from gpushare_operator.scheduling.slim import slim_node
from gpushare_operator.status import StatusWriter


def release_memory() -> None:
    """Give the memory of a large LIST back to the system. The raw JSON of every pod is
    garbage once the cache holds its slim copy, but glibc keeps freed heap pages mapped;
    malloc_trim returns them (a no-op where glibc is absent)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _namespaced_name(item: Body) -> str:
    meta = path(item, "metadata")
    return f"{text(meta.get('namespace'))}/{text(meta.get('name'))}"


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
        self.api = api
        self.metrics = metrics or SchedulerMetrics()
        self.cache = SchedulerCache(config=self.current_config)
        self.queue = SchedulingQueue(config=self.current_config)
        self.gangs = GangBook()
        self.reporter = Reporter(api)
        self.scheduler = Scheduler(
            cache=self.cache,
            queue=self.queue,
            gangs=self.gangs,
            api=api,
            reporter=self.reporter,
            metrics=self.metrics,
            config=self.current_config,
            pod_event=self.pod_event,
        )
        self.status = StatusWriter(
            cache=self.cache,
            gangs=self.gangs,
            api=api,
            metrics=self.metrics,
            config=self.current_config,
        )
        self.elector = LeaseElector(
            api,
            config=self.current_config,
            on_started_leading=self._start_leading,
            on_stopped_leading=self._stop_leading,
        )
        self._pods = Reflector(
            "pods",
            api.lister("pods"),
            transform=PodInfo.parse,
            on_event=self.pod_event,
            on_listed=self._listed_pods,
        )
        nodes = Reflector(
            "nodes",
            api.lister("nodes"),
            transform=slim_node,
            on_event=self.node_event,
            on_listed=self._listed_nodes,
            key=name_of,
        )
        gpunodes = Reflector(
            "gpunodes",
            api.lister("gpunodes"),
            transform=dict,
            on_event=self.gpunode_event,
            on_listed=self._listed_gpunodes,
            key=name_of,
            optional=True,
        )
        # PodGroups before pods, so that a gang's members are never taken for single pods.
        groups = tuple(
            Reflector(
                f"podgroups.{group_api.group}",
                api.lister(group_api.name),
                transform=dict,
                on_event=functools.partial(self.group_event, group_api),
                on_listed=functools.partial(self._listed_groups, group_api),
                key=_namespaced_name,
                optional=True,
            )
            for group_api in GroupApi
        )
        priority_classes = Reflector(
            "priorityclasses",
            api.lister("priorityclasses"),
            transform=dict,
            on_event=self.priority_class_event,
            on_listed=self._listed_priority_classes,
            key=name_of,
            optional=True,
        )
        self.reflectors: tuple[Reflector[Any], ...] = (
            nodes,
            gpunodes,
            priority_classes,
            *groups,
            self._pods,
        )
        self.synced = asyncio.Event()
        self.started_at = time.monotonic()
        self.last_event: dict[str, float] = {}
        self._leader_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._logged_problems: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self._log = logs.get("operator", identity=config.identity)

    def current_config(self) -> OperatorConfig:
        return self.config

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._log.info("starting", config=describe(self.config))
        self.spawn(self.initial_sync(), "initial sync")
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
        await self._cancel_leader_tasks()  # before the reflectors: a resync may be under way
        for reflector in self.reflectors:
            await reflector.stop()
        if self.config.leader_elect:
            with contextlib.suppress(Exception):  # best effort on the way out
                await self.elector.release()

    @property
    def leading(self) -> bool:
        return self.elector.leading or not self.config.leader_elect

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
        decision on a stale cache can overcommit a card: so a new leader lists everything
        again first, unless the cache was listed after the leadership began."""
        await self.synced.wait()
        if self.config.leader_elect and self.listed_at < since:
            await self.resync()
        async with asyncio.TaskGroup() as work:
            work.create_task(self.scheduler.run(), name="scheduler")
            work.create_task(self.status.run(), name="status")

    # -- feeding the cache ---------------------------------------------------------------

    async def initial_sync(self) -> None:
        """Start the reflectors one kind after another (nodes first, so that pods land on
        known nodes; one large list at a time), then open the leader's work."""
        for reflector in self.reflectors:
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

    @property
    def listed_at(self) -> float:
        """When the cache last took a full LIST of every kind (monotonic)."""
        return min(reflector.listed_at for reflector in self.reflectors)

    async def resync(self) -> None:
        """LIST every kind again now, one after another, and return once the cache holds it."""
        for reflector in self.reflectors:
            await reflector.relist()
        self._log.info("resynced", nodes=len(self.cache.node_names()), pods=self._pods.count)

    def _listed_nodes(self, names: set[str], version: str) -> None:
        for name in set(self.cache.node_names()) - names:
            self.node_event(DELETED, {"metadata": {"name": name}})

    def _listed_gpunodes(self, names: set[str], version: str) -> None:
        for name in set(self.cache.gpunode_names()) - names:
            self.gpunode_event(DELETED, {"metadata": {"name": name}})

    def _listed_pods(self, uids: set[str], version: str) -> None:
        """Forget the pods the cache knows that a LIST did not show, unless the cache saw
        them in a state newer than the LIST (a pod read back after a refused bind): keeping
        a deleted pod errs on the safe side."""
        newest = int(version) if version.isdigit() else -1
        for uid in self.cache.known_pod_uids() - uids:
            if self._versions.get(f"pod/{uid}", -1) <= newest:
                self.pod_event(DELETED, PodInfo.gone(PodUid(uid)))
        # Pods the cache does not hold (not ours) whose deletion the watch missed.
        for key in [key for key in self._versions if key.startswith("pod/")]:
            if key.removeprefix("pod/") not in uids and self._versions[key] <= newest:
                del self._versions[key]

    def _stale(self, key: str, event_type: str, version: int | None) -> bool:
        """Whether an event shows an older state than the cache already holds."""
        if event_type == DELETED:
            self._versions.pop(key, None)
            return False
        if version is None:
            return False  # opaque: trust the order the watch delivers in
        if version < self._versions.get(key, -1):
            return True
        self._versions[key] = version
        return False

    def pod_event(self, event_type: str, pod: PodInfo) -> None:
        """The one way in for what is known of a pod: the watch's events, a LIST that no
        longer shows it, and the scheduler's own findings (a bind refused with 404 or 409)."""
        self.last_event["pods"] = time.monotonic()
        uid = pod.uid
        if self._stale(f"pod/{uid}", event_type, pod.resource_version):
            return
        if event_type == DELETED:
            change = self.cache.forget_pod(uid)
            self.reporter.forget(uid)
            self.queue.remove(uid)
            self._logged_problems.pop(f"pod {uid}", None)
            group = self.gangs.forget_member(uid)
            if group is not None:
                self.queue.wake(group)  # its gang is judged again without it
                if self.leading:
                    self.scheduler.gang_shrank(group)
        else:
            seen = self.cache.observe_pod(pod)
            change = seen.change
            for message in seen.problems:
                self._log_once(f"pod {uid}", message)
            self.gangs.observe_member(pod)
        if change is PodChange.PENDING:
            self.queue.add(uid, self.gangs.priority_of(pod))
        elif change is PodChange.BOUND:
            self.queue.remove(uid)
        elif change is PodChange.GONE:
            self.queue.remove(uid)
            self.queue.wake()
        elif change is PodChange.ASSIGNED:
            # Only pods of the same request were held back by the assignment wait.
            self.queue.wake(seen.signature)

    def group_event(self, group_api: GroupApi, event_type: str, body: Body) -> None:
        """A PodGroup changed: its parked members are judged again at once."""
        self.last_event["podgroups"] = time.monotonic()
        key = group_key(group_api, body)
        if self._stale(f"podgroup/{group_api.name}/{key}", event_type, resource_version(body)):
            return
        if event_type == DELETED:
            self.gangs.forget_group(key)
        else:
            self.gangs.observe_group(group_api, body)
        self.queue.wake(key)

    def priority_class_event(self, event_type: str, body: Body) -> None:
        """A PriorityClass a PodGroup may name (`priorityClassName`): its gang's priority."""
        name = text(path(body, "metadata").get("name")) or ""
        if event_type == DELETED:
            self.gangs.forget_priority_class(name)
        else:
            self.gangs.observe_priority_class(name, body.get("value"))

    def _listed_priority_classes(self, names: set[str], version: str) -> None:
        for name in self.gangs.priority_class_names() - names:
            self.gangs.forget_priority_class(name)

    def _listed_groups(self, group_api: GroupApi, names: set[str], version: str) -> None:
        for key in self.gangs.keys(group_api):
            if f"{key.namespace}/{key.name}" not in names:
                self.gangs.forget_group(key)
                self.queue.wake(key)

    def node_event(self, event_type: str, body: Body) -> None:
        self.last_event["nodes"] = time.monotonic()
        name = text(path(body, "metadata").get("name")) or ""
        if self._stale(f"node/{name}", event_type, resource_version(body)):
            return
        if event_type == DELETED:
            self.cache.forget_node(NodeName(name))
            return
        change = self.cache.observe_node(body)
        if change.problem:
            self._log_once(f"node {name}", change.problem)
        if change.changed:
            self.queue.wake()

    def gpunode_event(self, event_type: str, body: Body) -> None:
        self.last_event["gpunodes"] = time.monotonic()
        name = NodeName(text(path(body, "metadata").get("name")) or "")
        if self._stale(f"gpunode/{name}", event_type, resource_version(body)):
            return
        change = (
            self.cache.forget_gpunode(name)
            if event_type == DELETED
            else self.cache.observe_gpunode(body)
        )
        if change.problem:
            self._log_once(f"gpunode {name}", change.problem)
        if change.changed:
            self.queue.wake()

    def _log_once(self, key: str, message: str) -> None:
        if self._logged_problems.get(key) != message:
            self._logged_problems[key] = message
            self._log.warning("cannot_honour", object=key, problem=message)

    # -- live configuration --------------------------------------------------------------

    async def apply_config(self, event_type: str, name: str, spec: Body) -> tuple[bool, str]:
        """Apply a GPUShareConfig; returns (accepted, message) for its status."""
        live = contract.LIVE_CONFIG_NAME
        if name != live:
            return False, f"ignored: only the GPUShareConfig named {live!r} is read"
        try:
            config = (
                self.base_config if event_type == DELETED else with_live(self.base_config, spec)
            )
        except ConfigError as error:
            self._log.warning("config_refused", error=str(error))
            return False, f"{error}; the previous configuration stays in force"
        names_changed = config.scheduler_names != self.config.scheduler_names
        self.config = config
        if names_changed:
            # Pods of a newly served (or dropped) scheduler name wait unbound: look again
            # (also when the first list is under way; before it starts, it will see them).
            await self._pods.relist()
        self._log.info("config_applied", config=describe(config))
        return True, "applied"

"""The intake: every event the operator learns the cluster from, and nothing else, as
kube-scheduler keeps its informer handlers in `eventhandlers.go`.

Its sources: the reflectors' events and LISTs (pods, nodes, GPUNodes, PodGroups,
PriorityClasses, PodDisruptionBudgets, PersistentVolumeClaims, PersistentVolumes and
StorageClasses), and the scheduler's own findings (a bind answered
404 is a deletion, a 409 is read back), which the scheduler puts on the `findings` queue
rather than calling in. Each event is checked against the newest version already taken (the
stale filter), then handed to the cache, the gang book, the queue and the labeller. What an
event calls for beyond the cache is queue work that the decision loop carries out: a pod to
schedule, parked pods to wake, a gang that lost a member to check
(`SchedulingQueue.check_gang`), and a pod to label that the labeller writes. Nothing here
calls the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from gpushare import logs
from gpushare.kube.reflector import DELETED
from gpushare.model import NodeName, PodUid
from gpushare.model.bodies import Body, path, resource_version, text
from gpushare.model.gangs import GroupApi, group_key
from gpushare.model.volumes import Claim, StorageClass, Volume
from gpushare_operator.labeller import Labeller
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import PodChange, SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.queue import SchedulingQueue

DELETED_PODS_KEPT = 10_000
"""More deletions than land while one read-back is in flight (a second or so)."""

Finding = tuple[str, PodInfo]
"""What the scheduler found of a pod by its own calls: (watch event type, the pod)."""


class VolumeChanges:
    """A wake-up for binds that wait until their claims are bound: each change of a claim or
    volume wakes every waiter, which looks again at what it waits for."""

    def __init__(self) -> None:
        self._next = asyncio.Event()

    def changed(self) -> None:
        self._next.set()
        self._next = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Until the next change, or `timeout_s` (no error either way)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._next.wait()


class Intake:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        queue: SchedulingQueue,
        gangs: GangBook,
        reporter: Reporter,
        labeller: Labeller,
    ) -> None:
        self.cache = cache
        self.queue = queue
        self.gangs = gangs
        self.reporter = reporter
        self.labeller = labeller
        self.findings: asyncio.Queue[Finding] = asyncio.Queue()
        self.volume_changes = VolumeChanges()
        """Told of every change of a claim or volume (binds wait on their claims)."""
        self.last_event: dict[str, float] = {}
        """When each kind last had an event (monotonic), for the liveness probe."""
        self._versions: dict[str, int] = {}
        self._deleted_pods: dict[PodUid, None] = {}
        """The uids of the latest pods deleted, oldest first: a pod's uid never comes back,
        so a read of it taken before its deletion (the scheduler's read-back) is stale."""
        self._logged_problems: dict[str, str] = {}
        self._log = logs.get("intake")

    async def take_findings(self) -> None:
        """Take the scheduler's findings as events, for ever (cancel to stop)."""
        while True:
            event_type, pod = await self.findings.get()
            self.pod_event(event_type, pod)

    # -- the stale filter ------------------------------------------------------------------

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

    def _deleted_before(self, uid: PodUid, event_type: str) -> bool:
        """Whether the pod was deleted before this event came (a deletion is recorded)."""
        if event_type != DELETED:
            return uid in self._deleted_pods
        self._deleted_pods[uid] = None
        if len(self._deleted_pods) > DELETED_PODS_KEPT:
            del self._deleted_pods[next(iter(self._deleted_pods))]
        return False

    # -- pods ----------------------------------------------------------------------------

    def pod_event(self, event_type: str, pod: PodInfo) -> None:
        """What is known of a pod: the watch's events, a LIST that no longer shows it, and
        the scheduler's findings."""
        self.last_event["pods"] = time.monotonic()
        uid = pod.uid
        if self._deleted_before(uid, event_type) or self._stale(
            f"pod/{uid}", event_type, pod.resource_version
        ):
            return
        if event_type == DELETED:
            change = self.cache.forget_pod(uid)
            self.reporter.forget(uid)
            self.labeller.forget(uid)
            self.queue.remove(uid)
            self._logged_problems.pop(f"pod {uid}", None)
            group = self.gangs.forget_member(uid)
            if group is not None:
                self.queue.wake(group)  # its gang is judged again without it
                self.queue.check_gang(group)  # and whether what it holds must go
        else:
            seen = self.cache.observe_pod(pod)
            change = seen.change
            for message in seen.problems:
                self._log_once(f"pod {uid}", message)
            self.gangs.observe_member(pod)
            self.labeller.observe(pod)
        if change is PodChange.PENDING:
            self.queue.add(uid, self.gangs.priority_of(pod))
        elif change is PodChange.BOUND:
            self.queue.remove(uid)
            where = self.cache.cards_of(uid) if pod.terminating else None
            if where is not None:
                for card in where[1]:
                    self.queue.card_freeing(where[0], card)
        elif change is PodChange.GONE:
            self.queue.remove(uid)
            self.queue.wake()
        elif change is PodChange.ASSIGNED:
            # Only pods of the same request were held back by the assignment wait.
            self.queue.wake(seen.signature)

    def listed_pods(self, uids: set[str], version: str) -> None:
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

    # -- nodes and GPUNodes --------------------------------------------------------------

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

    def listed_nodes(self, names: set[str], version: str) -> None:
        for name in set(self.cache.node_names()) - names:
            self.node_event(DELETED, {"metadata": {"name": name}})

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

    def listed_gpunodes(self, names: set[str], version: str) -> None:
        for name in set(self.cache.gpunode_names()) - names:
            self.gpunode_event(DELETED, {"metadata": {"name": name}})

    # -- PodGroups and PriorityClasses ---------------------------------------------------

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

    def listed_groups(self, group_api: GroupApi, names: set[str], version: str) -> None:
        for key in self.gangs.keys(group_api):
            if f"{key.namespace}/{key.name}" not in names:
                self.gangs.forget_group(key)
                self.queue.wake(key)

    def priority_class_event(self, event_type: str, body: Body) -> None:
        """A PriorityClass a PodGroup may name (`priorityClassName`): its gang's priority."""
        name = text(path(body, "metadata").get("name")) or ""
        if event_type == DELETED:
            self.gangs.forget_priority_class(name)
        else:
            self.gangs.observe_priority_class(name, body.get("value"))

    def listed_priority_classes(self, names: set[str], version: str) -> None:
        for name in self.gangs.priority_class_names() - names:
            self.gangs.forget_priority_class(name)

    # -- PodDisruptionBudgets ------------------------------------------------------------

    def budget_event(self, event_type: str, body: Body) -> None:
        """A PodDisruptionBudget: which sets of victims preemption may choose."""
        meta = path(body, "metadata")
        namespace, name = text(meta.get("namespace")) or "", text(meta.get("name")) or ""
        if event_type == DELETED:
            self.cache.forget_budget(namespace, name)
            self.queue.wake()
        elif self.cache.observe_budget(body):
            self.queue.wake()  # it allows more: a preemption it blocked may go now

    def listed_budgets(self, names: set[str], version: str) -> None:
        for namespace, name in self.cache.budget_keys():
            if f"{namespace}/{name}" not in names:
                self.cache.forget_budget(namespace, name)

    # -- PersistentVolumeClaims, PersistentVolumes and StorageClasses ----------------------

    def claim_event(self, event_type: str, claim: Claim) -> None:
        """A claim: pods that wait for it may fit now, binds that wait for it may go on."""
        book = self.cache.volumes
        changed = (
            book.forget_claim(claim.key) if event_type == DELETED else book.observe_claim(claim)
        )
        self.volume_changes.changed()
        if changed:
            self.queue.wake()

    def listed_claims(self, keys: set[str], version: str) -> None:
        book = self.cache.volumes
        for namespace, name in list(book.claims):
            if f"{namespace}/{name}" not in keys:
                book.forget_claim((namespace, name))
        book.listed = True
        self.volume_changes.changed()
        self.queue.wake()

    def volume_event(self, event_type: str, volume: Volume) -> None:
        book = self.cache.volumes
        changed = (
            book.forget_volume(volume.name)
            if event_type == DELETED
            else book.observe_volume(volume)
        )
        self.volume_changes.changed()
        if changed:
            self.queue.wake()

    def listed_volumes(self, names: set[str], version: str) -> None:
        book = self.cache.volumes
        for name in set(book.volumes) - names:
            book.forget_volume(name)
        self.volume_changes.changed()

    def class_event(self, event_type: str, storage: StorageClass) -> None:
        book = self.cache.volumes
        if (
            book.forget_class(storage.name)
            if event_type == DELETED
            else book.observe_class(storage)
        ):
            self.queue.wake()

    def listed_classes(self, names: set[str], version: str) -> None:
        book = self.cache.volumes
        for name in set(book.classes) - names:
            book.forget_class(name)

    def _log_once(self, key: str, message: str) -> None:
        if self._logged_problems.get(key) != message:
            self._logged_problems[key] = message
            self._log.warning("cannot_honour", object=key, problem=message)

"""Allocate and GetPreferredAllocation: the shared model decides, this module does the I/O.

The decision (which pod, which container, which card, which env) is
`gpushare.model.allocation.match_container`. Here: read the kubelet's pod-resources records
(`PodResources`: which pod it is admitting), wait for the watch cache when the pod is not in
it yet, and record the containers served. Allocate writes nothing itself: `gpu-assigned`
(`mark_started`) follows at once for a pod the records named, else once its status shows the
kubelet admitted it (the call names device ids, not the pod: a guess may have been served
under another pod's name). Without the records the operator keeps pods of the same request
on one card (the exactness rule), so whichever of them the kubelet starts, the grant names its
card, and a call whose candidates hold different cards is refused rather than guessed; a
start never waits on the apiserver.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.retry import WRITE, retry, transient
from gpushare.model.allocation import (
    ContainerGrant,
    KubeletView,
    NoCandidate,
    Unservable,
    match_container,
    preferred_device_ids,
    unplaced_pods,
)
from gpushare.model.device_list import DeviceListing
from gpushare.model.limits import LimitSettings
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodUid
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.kubeapi import PluginApi
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache
from gpushare_plugin.podresources import PodResources

MARK_AGAIN_S = 2.0
"""The wait before a gpu-assigned write the apiserver did not take is tried again."""
FORBIDDEN = 403

RECORDS_AGAIN_S = 0.05
"""While the kubelet's records could not be read, how soon a call that found no pod reads
them again."""

BYPASS_WAIT_S = 0.3
"""The watch's grace when the pod being started is most likely one no scheduler placed: its
refusal (GetPreferredAllocation, then Allocate) comes within a second."""


@dataclass(frozen=True, slots=True)
class Matched:
    grants: list[ContainerGrant]
    watch_wait_s: float
    records_s: float
    """Spent reading the kubelet's records."""
    identified: bool
    """The kubelet's records named the pod (else: the oldest of its request, a guess)."""


@dataclass(frozen=True, slots=True)
class Preferred:
    ids: tuple[frozenset[str], ...]
    """The ids answered, per container request."""
    grants: tuple[ContainerGrant, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class PreferredRequest:
    available: Sequence[str]
    must_include: Sequence[str]
    size: int


class Allocator:
    def __init__(
        self,
        *,
        table: DeviceTable,
        pods: PodCache,
        api: PluginApi,
        metrics: PluginMetrics,
        listing: DeviceListing,
        limits: LimitSettings | None,
        wait_s: float,
        schedulers: frozenset[str],
        kubelet_records: PodResources | None = None,
    ) -> None:
        self._table = table
        self._pods = pods
        self._api = api
        self._metrics = metrics
        self._listing = listing
        self._limits = limits
        self.granted: dict[tuple[PodUid, str], ContainerGrant] = {}
        """What this plugin gave each container it served: its own record of the grants."""
        self._wait_s = wait_s
        self._schedulers = schedulers
        self._kubelet_records = kubelet_records
        self._preferred: dict[GpuKind, Preferred] = {}
        """The pods the kubelet's records named in the last GetPreferredAllocation."""
        self._lock = asyncio.Lock()  # one decision at a time: `served` is read, then written
        self._log = logs.get("allocate", node=table.node)

    def _match(
        self, kind: GpuKind, counts: Sequence[int], kubelet: KubeletView | None
    ) -> list[ContainerGrant]:
        """Grants for each container request of one call, in order (a kubelet sends one)."""
        served = dict(self._pods.served)
        inventory = self._table.inventory()
        grants = []
        for count in counts:
            grant = match_container(
                self._pods.pods(),
                served,
                kind=kind,
                count=count,
                inventory=inventory,
                listing=self._listing,
                schedulers=self._schedulers,
                limits=self._limits,
                reopened=frozenset(self._pods.reopened),
                kubelet=kubelet,
            )
            served[grant.pod.uid] = grant.position + 1
            grants.append(grant)
        return grants

    async def _kubelet_view(self, kind: GpuKind) -> KubeletView | None:
        if self._kubelet_records is None:
            return None
        return await self._kubelet_records.view(kind.value)

    async def _match_waiting(self, kind: GpuKind, counts: Sequence[int]) -> Matched:
        """Match, giving the watch up to `wait_s` to deliver a pod the kubelet saw first (half
        way through, the node's pods are listed again); only `BYPASS_WAIT_S` when a pod no
        scheduler placed, of that size, is on the node: the kubelet is most likely starting
        it, and every pod behind it waits on this lock. The kubelet's records are read again
        for each try."""
        started = time.monotonic()
        # Python 3.11's wait_for(timeout=0) times out even on an event already set.
        if not self._pods.synced.is_set():
            try:
                await asyncio.wait_for(self._pods.synced.wait(), timeout=self._wait_s)
            except TimeoutError:
                raise NoCandidate(
                    f"the device plugin on node {self._table.node} has not read the pods bound "
                    f"there from the apiserver yet (it waited {self._wait_s:g} s, "
                    f"--allocate-wait-seconds), so it cannot tell which card this pod was "
                    f"given: the kubelet fails the pod (UnexpectedAdmissionError) and does not "
                    f"try it again. Create the pod again (its controller does) once the "
                    f"plugin's log on the node says 'pods on node listed'; until it does, its "
                    f"log says why it cannot list them"
                ) from None
        listed_again = False
        records_s = 0.0
        while True:
            asked = time.monotonic()
            kubelet = await self._kubelet_view(kind)
            records_s += time.monotonic() - asked
            try:
                grants = self._match(kind, counts, kubelet)
                waited = time.monotonic() - started - records_s
                return Matched(grants, waited, records_s, kubelet is not None)
            except Unservable:
                raise  # its pod is here: no watch event will help
            except NoCandidate:
                unplaced = unplaced_pods(
                    self._pods.pods(), kind=kind, schedulers=self._schedulers, count=counts[0]
                )
                wait_s = min(self._wait_s, BYPASS_WAIT_S) if unplaced else self._wait_s
                waited = time.monotonic() - started
                if waited >= wait_s:
                    # Which grace ran out says whether the node's admissions were held long.
                    self._log.info("watch_grace_over", resource=kind.value, grace_s=wait_s)
                    raise
                if not unplaced and not listed_again and waited >= wait_s / 2:
                    # Half the grace and still no pod: the watch lags or its connection went
                    # quiet (half-open); one LIST of the node's pods answers either way.
                    listed_again = True
                    self._log.info("watch_late", resource=kind.value, waited_s=round(waited, 3))
                    self._pods.list_again()
                until = wait_s if unplaced or listed_again else wait_s / 2
                if kubelet is None and self._kubelet_records is not None:
                    # Unread records (its rate limit): read them again soon, whatever the watch.
                    until = min(until, waited + RECORDS_AGAIN_S)
                await self._pods.wait_change(until - waited)

    def _as_preferred(self, kind: GpuKind, requests: Sequence[Sequence[str]]) -> Matched | None:
        """The pods the kubelet's records named in the GetPreferredAllocation just before, if
        this call takes the ids preferred there and they still wait: the kubelet asks both
        for a container in a row, and admits one container at a time."""
        preferred = self._preferred.pop(kind, None)
        if preferred is None or preferred.ids != tuple(frozenset(ids) for ids in requests):
            return None
        named = KubeletView.listing(
            (g.pod.namespace, g.pod.name, g.position > 0) for g in preferred.grants
        )
        try:
            grants = self._match(kind, [len(ids) for ids in requests], named)
        except NoCandidate:
            return None
        for now, then in zip(grants, preferred.grants, strict=True):
            if now.pod.uid != then.pod.uid:
                # Deleted and created again under its name since (the records name no uid):
                # the kubelet is starting the pod that is gone, whose card is not its own now.
                raise NoCandidate(
                    f"pod {then.pod} was deleted while the kubelet started it; no card is "
                    f"given to the pod now of that name, whose own start is still to come",
                    pods=[],
                )
        return Matched(grants, 0, 0, True)

    async def allocate(
        self, kind: GpuKind, requests: Sequence[Sequence[str]]
    ) -> list[ContainerGrant]:
        """Grants for one call's container requests (the device ids the kubelet chose for
        each); only the number of ids decides."""
        counts = [len(ids) for ids in requests]
        started = time.perf_counter()
        result = "error"
        try:
            async with self._lock:
                locked_s = time.perf_counter() - started
                matched = self._as_preferred(kind, requests) or await self._match_waiting(
                    kind, counts
                )
                grants = matched.grants
                for grant in grants:
                    self._pods.served[grant.pod.uid] = grant.position + 1
                    if grant.pod.uid in self._pods.reopened and grant.last:
                        self._pods.served_again(grant.pod.uid)
                    self.granted[(grant.pod.uid, grant.container)] = grant
            for grant in grants:
                if grant.problem:
                    self._log.warning("annotation_not_followed", problem=grant.problem)
                for variable in grant.kept:
                    # The container's own value wins over ours (the kubelet puts it last).
                    self._log.warning(
                        "framework_limit_kept_own",
                        pod=str(grant.pod),
                        container=grant.container,
                        variable=variable,
                        consequence="the framework is not limited to the container's share",
                    )
                    self._metrics.limits_kept.labels(variable).inc()
                self._log.info(
                    "container allocated",
                    pod=str(grant.pod),
                    container=grant.container,
                    card=",".join(str(c.index) for c in grant.cards),
                    env=grant.env,
                    last=grant.last,
                    # Where a start's time goes (bench/realnode.py reads these).
                    allocate_ms=round((time.perf_counter() - started) * 1000, 2),
                    lock_wait_ms=round(locked_s * 1000, 2),
                    watch_wait_ms=round(matched.watch_wait_s * 1000, 2),
                    records_ms=round(matched.records_s * 1000, 2),
                    identified=matched.identified,
                )
            if matched.identified and grants[-1].last:
                # The kubelet's records named the pod: it is the one starting, whatever
                # other pods of its request do.
                started_pod = self._pods.get(grants[-1].pod.uid)
                if started_pod is not None and started_pod.active:
                    self._pods.to_mark.put_nowait(started_pod)
            result = "ok"
            return grants
        except NoCandidate as refusal:
            result = "no_candidate"
            self._log.warning(
                "allocate refused",
                resource=kind.value,
                counts=list(counts),
                reason=str(refusal),
                pods=list(refusal.pods),
            )
            raise
        finally:
            self._metrics.allocations.labels(kind.value, result).inc()
            self._metrics.allocate_latency.labels(kind.value).observe(time.perf_counter() - started)

    async def close(self) -> None:
        if self._kubelet_records is not None:
            await self._kubelet_records.close()

    async def mark_started(self, workers: int = 4) -> None:
        """Mark `gpu-assigned` on each pod the kubelet admitted (`PodCache.to_mark`), so the
        operator stops keeping its request on its card; for ever. A write that got no answer,
        a busy one, or a forbidden one is queued again (a start is never forgotten: an
        apiserver just started answers 403 until its RBAC caches are filled); a refusal that
        stays (the pod gone or replaced) is logged and dropped."""

        loop = asyncio.get_running_loop()

        async def work() -> None:
            while True:
                pod = await self._pods.to_mark.get()
                now = self._pods.get(pod.ref.uid)
                marked = self._pods.marked
                if now is None or not now.active or now.assigned or pod.ref.uid in marked:
                    continue  # gone, finished, or marked meanwhile (its records, its status)
                marked.add(pod.ref.uid)
                try:
                    # Its uid the precondition, not its resourceVersion: the kubelet is
                    # writing its status meanwhile, and the one annotation changes nothing else.
                    await retry(functools.partial(self._api.mark_assigned, pod.ref), WRITE)
                    self._log.info("pod_marked_assigned", pod=str(pod.ref))
                except (ApiError, OSError, TimeoutError) as error:
                    marked.discard(pod.ref.uid)
                    again = transient(error) or (
                        isinstance(error, ApiError) and error.status == FORBIDDEN
                    )
                    self._log.warning(
                        "mark_assigned_failed", pod=str(pod.ref), error=str(error), retry=again
                    )
                    if again:  # later, without holding this writer meanwhile
                        loop.call_later(MARK_AGAIN_S, self._pods.to_mark.put_nowait, pod)

        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(work())

    async def preferred(
        self, kind: GpuKind, requests: Sequence[PreferredRequest]
    ) -> list[list[str]]:
        """Ids on the card the pod was given; the kubelet's own choice if no pod matches
        (Allocate then refuses with the reason)."""
        started = time.perf_counter()
        async with self._lock:
            locked_s = time.perf_counter() - started
            self._preferred.pop(kind, None)
            try:
                matched = await self._match_waiting(kind, [r.size for r in requests])
            except NoCandidate:
                return [list(r.available[: r.size]) for r in requests]
            answer = [
                preferred_device_ids(grant, kind, r.available, r.must_include, r.size)
                for grant, r in zip(matched.grants, requests, strict=True)
            ]
            if matched.identified:
                self._preferred[kind] = Preferred(
                    tuple(frozenset(ids) for ids in answer), tuple(matched.grants)
                )
        for grant in matched.grants:
            self._log.info(
                "devices preferred",
                pod=str(grant.pod),
                container=grant.container,
                preferred_ms=round((time.perf_counter() - started) * 1000, 2),
                lock_wait_ms=round(locked_s * 1000, 2),
                watch_wait_ms=round(matched.watch_wait_s * 1000, 2),
                records_ms=round(matched.records_s * 1000, 2),
            )
        return answer

"""Allocate and GetPreferredAllocation: the shared model decides, this module does the I/O.

The decision (which pod, which container, which card, which env) is
`gpushare.model.allocation.match_container`. Here: wait for the watch cache when the pod is
not in it yet, record the containers served, and mark the pod `gpu-assigned` once its last GPU
container is served, with a resourceVersion precondition (re-read and retried on conflict, so
a concurrent label change does not fail a start, while a deleted pod does).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.retry import WRITE, retry, transient, wait_s
from gpushare.model import contract
from gpushare.model.allocation import (
    ContainerGrant,
    NoCandidate,
    match_container,
    preferred_device_ids,
    unplaced_pods,
)
from gpushare.model.bound import bound_pod
from gpushare.model.device_list import DeviceListing
from gpushare.model.limits import LimitSettings
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodRef, PodUid
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.kubeapi import PluginApi
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache

_CONFLICT_ATTEMPTS = 3
_GONE_ATTEMPTS = 3


class _PodGone(NoCandidate):
    def __init__(self, pod: PodRef) -> None:
        super().__init__(f"pod {pod} was deleted while its containers started")
        self.uid = pod.uid


BYPASS_WAIT_S = 0.3
"""The watch's grace when the pod being started is most likely one no scheduler placed: its
refusal (GetPreferredAllocation, then Allocate) comes within a second."""


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
        self._lock = asyncio.Lock()  # one decision at a time: `served` is read, then written
        self._log = logs.get("allocate", node=table.node)

    def _match(self, kind: GpuKind, counts: Sequence[int]) -> list[ContainerGrant]:
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
            )
            served[grant.pod.uid] = grant.position + 1
            grants.append(grant)
        return grants

    async def _match_waiting(self, kind: GpuKind, counts: Sequence[int]) -> list[ContainerGrant]:
        """Match, giving the watch up to `wait_s` to deliver a pod the kubelet saw first; only
        `BYPASS_WAIT_S` when a pod no scheduler placed, of that size, is on the node: the
        kubelet is most likely starting it, and every pod behind it waits on this lock."""
        started = time.monotonic()
        await asyncio.wait_for(self._pods.synced.wait(), timeout=self._wait_s)
        while True:
            try:
                return self._match(kind, counts)
            except NoCandidate:
                unplaced = unplaced_pods(
                    self._pods.pods(), kind=kind, schedulers=self._schedulers, count=counts[0]
                )
                wait_s = min(self._wait_s, BYPASS_WAIT_S) if unplaced else self._wait_s
                left = started + wait_s - time.monotonic()
                if left <= 0:
                    raise
                await self._pods.wait_change(left)

    async def allocate(self, kind: GpuKind, counts: Sequence[int]) -> list[ContainerGrant]:
        started = time.perf_counter()
        result = "error"
        try:
            async with self._lock:
                grants = await self._serve(kind, counts)
                for grant in grants:
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
                    assigned=grant.last,
                )
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

    async def _serve(self, kind: GpuKind, counts: Sequence[int]) -> list[ContainerGrant]:
        """Match, record and mark. A pod matched but deleted meanwhile is dropped and the
        call matched again: the call may be for a neighbour of the same request, which must
        not fail for it."""
        attempt = 0
        while True:
            attempt += 1
            grants = await self._match_waiting(kind, counts)
            # Recorded before the writes: the kubelet may admit a pod while they are in
            # flight (with this call's grant or an earlier one), and a pod admitted that the
            # record shows unserved is taken for one started with another's grant.
            before = self._pods.serve({g.pod.uid: g.position + 1 for g in grants})
            try:
                for grant in grants:
                    if grant.last:
                        await self._mark_assigned(grant)
                self._pods.answered(before)
                return grants
            except _PodGone as gone:
                self._pods.unserve(before)
                self._pods.forget(gone.uid)
                if attempt == _GONE_ATTEMPTS:
                    raise
            except BaseException:  # refused, or the call cancelled: the kubelet got nothing
                self._pods.unserve(before)
                raise

    async def _mark_assigned(self, grant: ContainerGrant) -> None:
        """Not `retry`: two budgets in one loop. A write with no answer, or a busy one, waits
        and is tried again (`retry.WRITE`, one budget for the whole call); a conflict re-reads
        the pod and writes again at once, with the new resourceVersion (a budget of its own)."""
        version = grant.resource_version
        delays = WRITE.delays()
        conflicts = 0
        while True:
            try:
                await self._api.mark_assigned(grant.pod, version)
                return
            except (ApiError, OSError, TimeoutError) as error:
                if isinstance(error, ApiError) and error.status == 409:
                    failure = None
                elif isinstance(error, ApiError) and error.status == 404:
                    raise _PodGone(grant.pod) from error
                elif transient(error):
                    # The apiserver restarting or busy: the decision stands, the write waits.
                    delay = next(delays, None)
                    if delay is None:
                        raise NoCandidate(
                            f"pod {grant.pod}: the apiserver did not take the write ({error}); "
                            f"could not set {contract.GPU_ASSIGNED}"
                        ) from error
                    failure = wait_s(delay, error)
                else:
                    raise NoCandidate(
                        f"pod {grant.pod}: could not set {contract.GPU_ASSIGNED} ({error}); "
                        f"the kubelet will retry the start"
                    ) from error
            if failure is not None:
                await asyncio.sleep(failure)
                continue
            body = await self._api.read_pod(grant.pod)
            current = bound_pod(body) if body is not None else None
            if current is None or current.ref.uid != grant.pod.uid or not current.active:
                raise _PodGone(grant.pod)
            if current.gpu_index != self._pods_index(grant.pod.uid):
                raise NoCandidate(
                    f"pod {grant.pod}: {contract.GPU_INDEX} changed while its containers "
                    f"started; refusing to guess a card"
                )
            version = current.resource_version
            conflicts += 1
            if conflicts >= _CONFLICT_ATTEMPTS:
                raise NoCandidate(
                    f"pod {grant.pod} kept changing; could not set {contract.GPU_ASSIGNED}"
                )

    async def mark_adopted(self) -> None:
        """Mark `gpu-assigned` on each pod that took over a grant served under another's
        name (`PodCache.adopted`), so the operator stops waiting for it; for ever."""
        while True:
            pod = await self._pods.adopted.get()
            ref = pod.ref
            try:
                # Its uid the precondition, not its resourceVersion: the kubelet is writing
                # its status meanwhile, and the one annotation changes nothing else.
                await retry(functools.partial(self._api.mark_assigned, ref, None), WRITE)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("mark_adopted_failed", pod=str(ref), error=str(error))

    def _pods_index(self, uid: PodUid) -> str | None:
        cached = self._pods.get(uid)
        return cached.gpu_index if cached else None

    async def preferred(
        self, kind: GpuKind, requests: Sequence[PreferredRequest]
    ) -> list[list[str]]:
        """Ids on the card the pod was given; the kubelet's own choice if no pod matches
        (Allocate then refuses with the reason)."""
        async with self._lock:
            try:
                grants = await self._match_waiting(kind, [r.size for r in requests])
            except NoCandidate:
                return [list(r.available[: r.size]) for r in requests]
        return [
            preferred_device_ids(grant, kind, r.available, r.must_include, r.size)
            for grant, r in zip(grants, requests, strict=True)
        ]

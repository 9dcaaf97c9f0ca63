"""What each container really holds on the cards, measured every few seconds.

A measurement: the driver's processes on each card (`Discovery.processes`: NVML on a GPU node,
the fake spec's `processes:` elsewhere), each pid's cgroup read under `--proc-root` (the
host's /proc: the DaemonSet runs with hostPID), mapped to the pods bound to this node and
their containers (`gpushare.model.measured`), beside what each container was granted: this
plugin's own record of what Allocate gave it (`Allocator.granted`), or, for a container
served before a restart, the same grant worked out again from its pod (`container_grant`).

Published three ways: Prometheus gauges per container and card (used and granted bytes,
with the node), and the GPUNode annotation `gpushare.io/measured-usage`, from which the
operator writes each card's measured use into the GPUNode's status and judges over-use.
The annotation is written when what it says changes, and at least every `refresh_s`, so
that its time says how fresh it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Set
from pathlib import Path

from prometheus_client import Gauge

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import rfc3339
from gpushare.model import contract
from gpushare.model.allocation import ContainerGrant, NoCandidate, container_grant
from gpushare.model.bound import BoundPod
from gpushare.model.device_list import DeviceListing
from gpushare.model.measured import (
    UNKNOWN_GRANT,
    CgroupPlace,
    Grant,
    MeasuredUsage,
    Process,
    container_of,
    measure,
)
from gpushare.model.usage import PodUid
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery import Discovery
from gpushare_plugin.kubeapi import PluginApi
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache

MIB = 1024 * 1024
Labels = set[tuple[str, ...]]


def read_places(pids: Iterable[int], proc_root: Path) -> dict[int, CgroupPlace | None]:
    """Each pid's pod and container, from its cgroup file (None: gone, or in no container)."""
    places: dict[int, CgroupPlace | None] = {}
    for pid in pids:
        try:
            places[pid] = container_of((proc_root / str(pid) / "cgroup").read_text())
        except OSError:
            places[pid] = None  # it ended since the driver listed it
    return places


def grant_of(grant: ContainerGrant) -> Grant:
    """A served container's grant per card: its MiB on its one card (gpu-memory), each card
    whole (gpu-number)."""
    if len(grant.cards) == 1:
        return Grant({grant.cards[0].index: grant.allocated_mib})
    return Grant({card.index: card.total_mib for card in grant.cards})


class UsageMeter:
    def __init__(
        self,
        *,
        discovery: Discovery,
        table: DeviceTable,
        pods: PodCache,
        granted: dict[tuple[PodUid, str], ContainerGrant],
        api: PluginApi,
        metrics: PluginMetrics,
        proc_root: Path,
        listing: DeviceListing,
        refresh_s: float,
    ) -> None:
        self._discovery = discovery
        self._table = table
        self._pods = pods
        self._granted = granted
        self._api = api
        self._metrics = metrics
        self._proc_root = proc_root
        self._listing = listing
        self._refresh_s = refresh_s
        self._published: tuple[str, float] | None = None  # what was written, and when
        self._problems: list[str] = []
        self._exported: tuple[Labels, Labels, Labels] = (set(), set(), set())
        """The label sets of the series last set: used, granted (known), unmapped."""
        self._log = logs.get("usage", node=table.node)

    async def run(self, interval_s: float) -> None:
        """Measure and publish every `interval_s`, until cancelled."""
        await self._pods.synced.wait()
        failed: str | None = None
        while True:
            try:
                await self.measure_and_publish()
                failed = None
            except Exception as error:  # Allocate must outlive a failed measurement
                # NVML or the proc root failing as nobody foresaw: the next measurement may
                # go. Said once until it changes or a measurement goes.
                if repr(error) != failed:
                    failed = repr(error)
                    self._log.exception("usage_not_measured", error=failed)
            await asyncio.sleep(interval_s)

    async def measure_and_publish(self) -> MeasuredUsage:
        found = await asyncio.to_thread(self._discovery.processes)
        if found.problems != self._problems:
            self._problems = found.problems
            for problem in found.problems:
                self._log.warning("processes_not_listed", problem=problem)
        processes = [Process(p.pid, p.card, p.used_mib) for p in found.found]
        places = await asyncio.to_thread(read_places, {p.pid for p in processes}, self._proc_root)
        pods = list(self._pods.pods())
        measured = measure(
            processes,
            places,
            {cid: (pod.ref, name) for pod in pods for cid, name in pod.container_ids.items()},
            self._grants(pods),
            at=rfc3339(),
        )
        self._export(measured)
        await self._publish(measured)
        return measured

    def _grants(self, pods: list[BoundPod]) -> dict[tuple[PodUid, str], Grant]:
        """This plugin's record of what it gave each container; for a container served
        before it started (a restart), the grant worked out again from its pod. The record's
        entries of pods gone from the node are dropped: it would only grow."""
        on_node = {pod.ref.uid for pod in pods}
        for key in [key for key in self._granted if key[0] not in on_node]:
            del self._granted[key]
        grants = {key: grant_of(grant) for key, grant in self._granted.items()}
        inventory = self._table.inventory()
        for pod in pods:
            if pod.request is None or pod.request.kind is None or not pod.admitted:
                continue
            for position in range(len(pod.request.containers)):
                try:
                    grant = container_grant(pod, position, inventory, listing=self._listing)
                except NoCandidate:
                    # Its card gone or unhealthy since, its node's unit changed, its memory
                    # record edited out of shape: what it was given cannot be told, so its use
                    # is shown and never judged.
                    for container in pod.request.containers:
                        grants.setdefault((pod.ref.uid, container.name), UNKNOWN_GRANT)
                    break
                grants.setdefault((pod.ref.uid, grant.container), grant_of(grant))
        return grants

    def _export(self, measured: MeasuredUsage) -> None:
        node = self._table.node
        used: dict[tuple[str, ...], float] = {}
        granted: dict[tuple[str, ...], float] = {}
        for use in measured.containers:
            labels = (node, use.pod.namespace, use.pod.name, use.container, str(use.card))
            used[labels] = use.used_mib * MIB
            if use.granted_mib is not None:
                granted[labels] = use.granted_mib * MIB
        unmapped: dict[tuple[str, ...], float] = {
            (node, str(card)): mib * MIB for card, mib in measured.unmapped_mib.items()
        }
        metrics = self._metrics
        before_used, before_granted, before_unmapped = self._exported
        self._exported = (
            _set_series(metrics.container_used_bytes, used, before_used),
            _set_series(metrics.container_granted_bytes, granted, before_granted),
            _set_series(metrics.unmapped_used_bytes, unmapped, before_unmapped),
        )

    async def _publish(self, measured: MeasuredUsage) -> None:
        text = measured.to_annotation()
        content = text.split(',"cards":', 1)[-1]  # all but the time
        now = time.monotonic()
        if self._published is not None:
            before, at = self._published
            if before == content and now - at < self._refresh_s:
                return
        try:
            await self._api.annotate_gpunode(self._table.node, {contract.MEASURED_USAGE: text})
        except (ApiError, OSError, TimeoutError) as error:
            self._log.warning("usage_publish_failed", error=repr(error))
            return
        self._published = (content, now)


def _set_series(
    gauge: Gauge, values: Mapping[tuple[str, ...], float], before: Set[tuple[str, ...]]
) -> set[tuple[str, ...]]:
    """Set each series of `values`, then remove those of `before` no longer among them: a
    scrape between the two sees every series that is still true (clearing first would hide
    them). The label sets now set."""
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    for gone in before - values.keys():
        gauge.remove(*gone)
    return set(values)

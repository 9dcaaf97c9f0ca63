"""A watch cache of the pods bound to this node: what Allocate matches against.

A Reflector (a LIST, then a WATCH resumed from the last version seen; a new LIST after a
410) keeps it current. Each pod is parsed once into a `BoundPod`. Allocate does not list:
when its pod is not in the cache yet (the kubelet saw the binding first), it waits on
`wait_change` for the watch to catch up, and only a watch late by half the grace has the
node's pods listed again (`list_again`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from gpushare import logs
from gpushare.kube.reflector import DELETED, Reflector
from gpushare.model.allocation import swapped_with
from gpushare.model.bound import BoundPod, bound_pod
from gpushare.model.usage import PodUid
from gpushare_plugin.kubeapi import PluginApi


class PodCache:
    def __init__(self, api: PluginApi, node: str) -> None:
        self._pods: dict[PodUid, BoundPod] = {}
        self.served: dict[PodUid, int] = {}
        """GPU containers of each pod this plugin has answered (kubelet order)."""
        self.reopened: set[PodUid] = set()
        """Pods served whose grant the kubelet gave another (`swapped_with`): to serve again."""
        self.to_mark: asyncio.Queue[BoundPod] = asyncio.Queue()
        """Pods the kubelet admitted (their status says so, or its records show the grant
        served under their own name), to mark gpu-assigned (the allocator does)."""
        self.marked: set[PodUid] = set()
        """Pods marked gpu-assigned by this plugin, or being marked: not written twice."""
        self._before_start: set[str] | None = None
        """The pods of the first LIST: another instance of the plugin may have served them."""
        self._reflector = Reflector(
            "pods",
            api.pod_lister(node),
            transform=bound_pod,
            on_event=self._apply,
            on_listed=self._listed,
        )
        self.synced = self._reflector.synced
        self._listing: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._log = logs.get("podcache", node=node)

    def pods(self) -> Iterable[BoundPod]:
        return self._pods.values()

    def get(self, uid: PodUid) -> BoundPod | None:
        return self._pods.get(uid)

    async def wait_change(self, timeout_s: float) -> None:
        """Return after the next change to the cache, or after `timeout_s`."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)

    async def run(self) -> None:
        """Keep the cache current for ever (cancel to stop)."""
        self._reflector.start()
        try:
            await asyncio.Event().wait()
        finally:
            listing = self._listing
            if listing is not None:
                listing.cancel()
            await self._reflector.stop()
            if listing is not None:
                await asyncio.gather(listing, return_exceptions=True)

    def list_again(self) -> None:
        """LIST the node's pods anew, in the background: the watch is late delivering a pod the
        kubelet already admits. The new relist ends the reflector's task, so a LIST still
        under way from an earlier call (hanging, perhaps, on a pooled connection gone
        half-open) is given up and its connection closed."""
        if self._listing is not None:
            self._listing.cancel()
        self._listing = asyncio.create_task(self._reflector.relist(), name="pods listed again")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _listed(self, uids: set[str], version: str) -> None:
        if self._before_start is None:
            self._before_start = set(uids)
        for uid in set(self._pods) - uids:
            self._pods.pop(uid)
            self.served.pop(uid, None)
            self.marked.discard(uid)
            self.reopened.discard(uid)
        self._notify()
        self._log.info("pods on node listed", pods=len(self._pods))

    def _apply(self, event_type: str, pod: BoundPod) -> None:
        uid = pod.ref.uid
        if event_type == DELETED:
            self._pods.pop(uid, None)
            self.served.pop(uid, None)
            self.marked.discard(uid)
            if uid in self.reopened:
                self.served_again(uid)
        else:
            before = self._pods.get(uid)
            self._pods[uid] = pod
            if pod.admitted and (before is None or not before.admitted):
                self._admitted(pod)
        self._notify()

    def _admitted(self, pod: BoundPod) -> None:
        """The kubelet admitted `pod`: every container of it has its devices now. Unless the
        record shows it served under its own name, it was admitted with a grant served under
        another's (`allocation.swapped_with`): the record follows the grant, and that other
        pod is served again when the kubelet starts it. Not for a pod of the first LIST: an
        earlier instance of the plugin may have served it."""
        uid = pod.ref.uid
        reopened = uid in self.reopened
        if not pod.active:  # refused by the kubelet (Failed), or finished: it took no grant
            return
        gpu = pod.request is not None and pod.request.kind is not None
        if gpu and pod.gpu_index is not None and not pod.assigned:
            self.to_mark.put_nowait(pod)  # a GPU pod started: it holds a grant now
        if not reopened and (uid in self.served or uid in (self._before_start or ())):
            return
        partner = swapped_with(pod, self._pods.values(), self.served)
        if reopened:
            self.served_again(uid)  # whoever took its own grant is served for good
        if pod.request is not None:
            self.served[uid] = len(pod.request.containers)
        if partner is None:
            return
        self.served.pop(partner, None)
        self.reopened.add(partner)
        self._log.info(
            "grant_taken_over",
            pod=str(pod.ref),
            served_as=str(self._pods[partner].ref),
            note="the kubelet started it with the grant given under the other's name; that pod "
            "is served again when the kubelet starts it",
        )

    def served_again(self, uid: PodUid) -> None:
        """A reopened pod was served again (or admitted, or is gone)."""
        self.reopened.discard(uid)

"""A watch cache of the pods bound to this node: what Allocate matches against.

A Reflector (a LIST, then a WATCH resumed from the last version seen; a new LIST after a
410) keeps it current. Each pod is parsed once into a `BoundPod`. Allocate never lists: when
its pod is not in the cache yet (the kubelet saw the binding first), it waits on
`wait_change` for the watch to catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from gpushare import logs
from gpushare.kube.reflector import DELETED, Reflector
from gpushare.model.allocation import BoundPod, bound_pod
from gpushare.model.usage import PodUid
from gpushare_plugin.kubeapi import PluginApi


class PodCache:
    def __init__(self, api: PluginApi, node: str) -> None:
        self._pods: dict[PodUid, BoundPod] = {}
        self.served: dict[PodUid, int] = {}
        """GPU containers of each pod this plugin has answered (kubelet order)."""
        self._reflector = Reflector(
            "pods",
            api.pod_lister(node),
            transform=bound_pod,
            on_event=self._apply,
            on_listed=self._listed,
        )
        self.synced = self._reflector.synced
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
        await self._reflector.run()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _listed(self, uids: set[str], version: str) -> None:
        for uid in set(self._pods) - uids:
            self._pods.pop(uid)
            self.served.pop(uid, None)
        self._notify()
        self._log.info("pods on node listed", pods=len(self._pods))

    def _apply(self, event_type: str, pod: BoundPod) -> None:
        if event_type == DELETED:
            self._pods.pop(pod.ref.uid, None)
            self.served.pop(pod.ref.uid, None)
        else:
            self._pods[pod.ref.uid] = pod
        self._notify()

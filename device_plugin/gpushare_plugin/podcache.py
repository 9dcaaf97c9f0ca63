"""A watch cache of the pods bound to this node: what Allocate matches against.

One LIST at start (and after a 410), then a WATCH from its resourceVersion. Each event is
parsed once into a `BoundPod`. Allocate never lists: when its pod is not in the cache yet (the
kubelet saw the binding first), it waits on `changed` for the watch to catch up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import aiohttp

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.model.allocation import BoundPod, bound_pod
from gpushare.model.usage import PodUid
from gpushare_plugin.kubeapi import PluginApi, WatchExpired

_BACKOFF_MAX_S = 30.0


class PodCache:
    def __init__(self, api: PluginApi, node: str) -> None:
        self._api = api
        self._node = node
        self._pods: dict[PodUid, BoundPod] = {}
        self.served: dict[PodUid, int] = {}
        """GPU containers of each pod this plugin has answered (kubelet order)."""
        self.synced = asyncio.Event()
        self._changed = asyncio.Condition()
        self._log = logs.get("podcache", node=node)

    def pods(self) -> Iterable[BoundPod]:
        return self._pods.values()

    def get(self, uid: PodUid) -> BoundPod | None:
        return self._pods.get(uid)

    async def wait_change(self, timeout_s: float) -> None:
        """Return after the next change to the cache, or after `timeout_s`."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait()
            except TimeoutError:
                return

    async def run(self) -> None:
        """Keep the cache current for ever (cancel to stop)."""
        backoff = 0.5
        while True:
            try:
                version = await self._relist()
                backoff = 0.5
                while True:
                    async for kind, body in self._api.watch_pods(self._node, version):
                        version = body.get("metadata", {}).get("resourceVersion") or version
                        if kind != "BOOKMARK":
                            await self._apply(kind, body)
            except WatchExpired:
                continue
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                # The apiserver restarting, a dropped connection, a cut-off stream.
                self._log.warning("pod watch failed; listing again", error=str(error))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _relist(self) -> str:
        items, version = await self._api.list_pods(self._node)
        pods = {}
        for body in items:
            pod = bound_pod(body)
            pods[pod.ref.uid] = pod
        async with self._changed:
            self._pods = pods
            self.served = {uid: n for uid, n in self.served.items() if uid in pods}
            self._changed.notify_all()
        self.synced.set()
        self._log.info("pods on node listed", pods=len(pods))
        return version

    async def _apply(self, kind: str, body: dict[str, Any]) -> None:
        pod = bound_pod(body)
        async with self._changed:
            if kind == "DELETED":
                self._pods.pop(pod.ref.uid, None)
                self.served.pop(pod.ref.uid, None)
            else:
                self._pods[pod.ref.uid] = pod
            self._changed.notify_all()

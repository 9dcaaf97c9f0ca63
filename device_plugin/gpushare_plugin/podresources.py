"""Which pod took a grant, from the kubelet's own records (the pod-resources API's `Get`).

Allocate names device ids, never the pod, so the plugin serves its best guess (the oldest pod
of that request; the exactness rule keeps them on one card, so the guess names the right
card). The kubelet records the ids as the container's the moment Allocate's answer reaches it
(the device manager's `allocateContainerResources`), so, asked after the answer, `Get` shows
them on the pod that took them: the guess first, then the others of that request. A pod the
kubelet does not know yet ("not found") is not asked again. Grants to plain init containers
are not shown (`Get` lists sidecars and app containers only), and any error gives no answer:
the pod's status says then, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpushare import logs
from gpushare.kube.retry import KUBELET_RECORDS, retry
from gpushare.model.bound import BoundPod
from gpushare.model.usage import PodUid
from gpushare_plugin._proto.podresources_v1 import api_pb2, api_pb2_grpc

GET_TIMEOUT_S = 0.5
FIRST_ASK_AFTER_S = 0.005
"""The answer is on its way when the lookup starts; the kubelet records the ids once it
arrives."""
QUIET_AFTER_FAILURE_S = 10.0
"""After the API failed (no socket, no answer), how long it is not asked."""
MOST_ASKED = 8
"""Pods asked about one grant, at most; the exactness rule keeps the pods of one request
waiting on a node to one card's worth."""


@dataclass(frozen=True, slots=True)
class Holding:
    """Who holds a grant in the kubelet's records."""

    holder: PodUid
    guess_holds_other: bool
    """The pod asked first (the guess) holds other ids of the resource: it took another
    grant."""


class NotRecorded(Exception):
    """None of the pods asked holds the ids (yet)."""


class PodResources:
    """The kubelet's pod-resources API on `socket`, asked which pod holds a grant."""

    def __init__(self, socket: Path, node: str) -> None:
        self._socket = socket
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self._unsupported = False
        self._quiet_until = 0.0
        self._log = logs.get("podresources", node=node)

    async def holder(
        self, resource: str, device_ids: Sequence[str], pods: Sequence[BoundPod]
    ) -> Holding | None:
        """Of `pods` (the guess first), the one whose containers hold `device_ids` of
        `resource` in the kubelet's records; None when none does within `KUBELET_RECORDS`'
        tries, or the records cannot be read."""
        if self._unsupported or not pods or time.monotonic() < self._quiet_until:
            return None
        search = _Search(resource, set(device_ids), list(pods[:MOST_ASKED]))
        await asyncio.sleep(FIRST_ASK_AFTER_S)
        try:
            holder = await retry(
                lambda: search.round(self._lister()), KUBELET_RECORDS, retryable=_not_yet
            )
        except NotRecorded:
            self._log.debug("grant_holder_unseen", resource=resource)
        except grpc.aio.AioRpcError as error:
            self._failed(error)
        else:
            return Holding(holder, search.guess_holds_other)
        return None

    def _lister(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self._socket}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _failed(self, error: grpc.aio.AioRpcError) -> None:
        if error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
            # Still over its rate limit after the tries: this grant's status will say.
            self._log.debug("pod_resources_rate_limited")
            return
        if _get_missing(error):
            self._unsupported = True
            self._log.warning(
                "pod_resources_get_missing",
                socket=str(self._socket),
                error=f"{error.code().name}: {error.details()}",
                consequence="pods are marked gpu-assigned once their status shows them admitted",
                fix="KubeletPodResourcesGet on the kubelet (1.27+; on by default from 1.34)",
            )
            return
        self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_S
        self._log.warning(
            "pod_resources_failed",
            socket=str(self._socket),
            error=f"{error.code().name}: {error.details()}",
            quiet_s=QUIET_AFTER_FAILURE_S,
            fix="mount the kubelet's pod-resources folder into the plugin (the chart does), "
            "or set --pod-resources-socket",
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class _Search:
    """One grant's lookup: each round asks the pods still in question."""

    def __init__(self, resource: str, wanted: set[str], pods: list[BoundPod]) -> None:
        self._resource = resource
        self._wanted = wanted
        self._guess = pods[0].ref.uid
        self._open = pods
        self.guess_holds_other = False

    async def round(self, lister: api_pb2_grpc.PodResourcesListerStub) -> PodUid:
        still: list[BoundPod] = []
        for pod in self._open:
            asked = api_pb2.GetPodResourcesRequest(
                pod_name=pod.ref.name, pod_namespace=pod.ref.namespace
            )
            try:
                answer = await lister.Get(asked, timeout=GET_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                if _not_found(error):
                    continue  # not admitted yet: the grant, already answered, is not its
                raise
            held = {
                device_id
                for container in answer.pod_resources.containers
                for devices in container.devices
                if devices.resource_name == self._resource
                for device_id in devices.device_ids
            }
            if held & self._wanted:
                return pod.ref.uid
            # Holding other ids, it took another grant; asked again all the same: a pod of
            # several GPU containers holds its first's while its last's is being recorded.
            self.guess_holds_other |= bool(held) and pod.ref.uid == self._guess
            still.append(pod)
        self._open = still
        raise NotRecorded


def _not_found(error: grpc.aio.AioRpcError) -> bool:
    """The kubelet answers a pod it does not know with a plain error (code UNKNOWN)."""
    return error.code() is grpc.StatusCode.UNKNOWN and "not found" in (error.details() or "")


def _get_missing(error: grpc.aio.AioRpcError) -> bool:
    """A kubelet without `Get` (before 1.27), or with it turned off: "PodResources API Get
    method disabled", a plain error too."""
    return error.code() is grpc.StatusCode.UNIMPLEMENTED or (
        error.code() is grpc.StatusCode.UNKNOWN and "disabled" in (error.details() or "")
    )


def _not_yet(error: Exception) -> bool:
    """Worth asking again: the kubelet has not recorded the ids yet, or its rate limit."""
    return isinstance(error, NotRecorded) or (
        isinstance(error, grpc.aio.AioRpcError)
        and error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    )

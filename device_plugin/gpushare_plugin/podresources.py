"""Whether the guessed pod took a grant, from the kubelet's own records (pod-resources `Get`).

Allocate names device ids, never the pod, so the plugin serves its best guess (the oldest pod
of that request; the exactness rule keeps them on one card, so the guess names the right
card). The kubelet records the ids as the container's the moment Allocate's answer reaches it
(the device manager's `allocateContainerResources`), so, asked after the answer, `Get` on the
guessed pod shows whether it took them. Only a yes is acted on (the pod is marked
gpu-assigned at once); a grant another pod took, one to a plain init container (`Get` lists
sidecars and app containers only), or any error leaves the pods' status to say, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from gpushare import logs
from gpushare.kube.retry import KUBELET_RECORDS, retry
from gpushare.model.usage import PodRef
from gpushare_plugin._proto.podresources_v1 import api_pb2, api_pb2_grpc

GET_TIMEOUT_S = 0.5
FIRST_ASK_AFTER_S = 0.005
"""The answer is on its way when the lookup starts; the kubelet records the ids once it
arrives."""
QUIET_AFTER_FAILURE_S = 10.0
"""After the API failed (no socket, no answer), how long it is not asked."""


class NotRecorded(Exception):
    """The pod does not hold the ids (yet)."""


class NotKnown(Exception):
    """The kubelet does not know the pod: it did not admit it, so it took no grant."""


class PodResources:
    """The kubelet's pod-resources API on `socket`, asked whether a pod holds a grant."""

    def __init__(self, socket: Path, node: str) -> None:
        self._socket = socket
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self._unsupported = False
        self._quiet_until = 0.0
        self._log = logs.get("podresources", node=node)

    async def holds(self, resource: str, device_ids: Sequence[str], pod: PodRef) -> bool:
        """Whether the kubelet's records show `pod` holding `device_ids` of `resource`,
        within `KUBELET_RECORDS`' tries; False too when they cannot be read."""
        if self._unsupported or time.monotonic() < self._quiet_until:
            return False
        wanted = set(device_ids)
        await asyncio.sleep(FIRST_ASK_AFTER_S)
        try:
            await retry(
                lambda: self._ask(resource, wanted, pod), KUBELET_RECORDS, retryable=_not_yet
            )
        except (NotRecorded, NotKnown):
            return False
        except grpc.aio.AioRpcError as error:
            self._failed(error)
            return False
        return True

    async def _ask(self, resource: str, wanted: set[str], pod: PodRef) -> None:
        asked = api_pb2.GetPodResourcesRequest(pod_name=pod.name, pod_namespace=pod.namespace)
        try:
            answer = await self._lister().Get(asked, timeout=GET_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            if _not_found(error):
                raise NotKnown from None
            raise
        held = {
            device_id
            for container in answer.pod_resources.containers
            for devices in container.devices
            if devices.resource_name == resource
            for device_id in devices.device_ids
        }
        if not held & wanted:
            raise NotRecorded

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

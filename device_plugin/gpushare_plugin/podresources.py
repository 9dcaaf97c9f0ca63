"""Which pod an Allocate is for, from the kubelet's own records (pod-resources `List`).

Allocate names device ids, never the pod. The kubelet adds a pod to its pod manager just
before admitting it, admits one pod at a time, and records a container's ids once Allocate
has answered: so, read during the call, its records show the pod it is admitting as the one
it knows whose container holds no device yet (`KubeletView`). `List` is served by every
kubelet since 1.20 (`Get` needed a feature gate until 1.34). The plugin asks once at start-up
(`readable`): if the records can be read, its GPUNode says `identifiesPods` and the operator
lets pods of one request take different cards on the node.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from gpushare import logs
from gpushare.kube.retry import KUBELET_RECORDS, retry
from gpushare.model.allocation import KubeletView
from gpushare_plugin._proto.podresources_v1 import api_pb2, api_pb2_grpc

LIST_TIMEOUT_S = 0.5
QUIET_AFTER_FAILURE_S = 1.0
"""After the records could not be read (no socket, no answer; not its rate limit), how long
they are not asked: calls meanwhile are answered as without them."""
LOG_FAILURE_EVERY_S = 10.0
CHANNEL_OPTIONS = (
    # A kubelet restarting takes its socket away for seconds: connect again within one.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class PodResources:
    """The kubelet's pod-resources API on `socket`."""

    def __init__(self, socket: Path, node: str) -> None:
        self._socket = socket
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self._quiet_until = 0.0
        self._logged_failure_at = -LOG_FAILURE_EVERY_S
        self._log = logs.get("podresources", node=node)

    async def readable(self) -> bool:
        """Whether the records can be read (asked once, at start-up)."""
        return await self.view("") is not None

    async def view(self, resource: str) -> KubeletView | None:
        """The kubelet's records of `resource` now; None when they cannot be read (logged,
        then not asked for `QUIET_AFTER_FAILURE_S`)."""
        if time.monotonic() < self._quiet_until:
            return None
        try:
            answer = await retry(
                lambda: self._lister().List(
                    api_pb2.ListPodResourcesRequest(), timeout=LIST_TIMEOUT_S
                ),
                KUBELET_RECORDS,
                retryable=_rate_limited,
            )
        except grpc.aio.AioRpcError as error:
            self._failed(error)
            return None
        return KubeletView.listing(
            (
                pod.namespace,
                pod.name,
                any(
                    devices.device_ids
                    for container in pod.containers
                    for devices in container.devices
                    if devices.resource_name == resource
                ),
            )
            for pod in answer.pod_resources
        )

    def _lister(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self._socket}", options=CHANNEL_OPTIONS
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _failed(self, error: grpc.aio.AioRpcError) -> None:
        if error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
            # Its rate limit, still, after the tries: the caller reads them again soon.
            self._log.info("pod_resources_rate_limited", socket=str(self._socket))
            return
        now = time.monotonic()
        self._quiet_until = now + QUIET_AFTER_FAILURE_S
        if now - self._logged_failure_at < LOG_FAILURE_EVERY_S:
            return
        self._logged_failure_at = now
        self._log.warning(
            "pod_resources_failed",
            socket=str(self._socket),
            error=f"{error.code().name}: {error.details()}",
            quiet_s=QUIET_AFTER_FAILURE_S,
            consequence="calls are answered by the oldest pod of the request, and refused "
            "while pods of that request hold different cards",
            fix="mount the kubelet's pod-resources folder into the plugin (the chart does), "
            "or set --pod-resources-socket",
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


def _rate_limited(error: Exception) -> bool:
    """Worth asking again: the kubelet's rate limit (its other clients count too)."""
    return (
        isinstance(error, grpc.aio.AioRpcError)
        and error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    )

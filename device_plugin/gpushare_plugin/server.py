"""The kubelet-facing gRPC servicer, one per resource: protobuf in, protobuf out, nothing else.

Decisions live in the allocator (and, below it, the shared model); the device list comes from
the DeviceTable. The ListAndWatch response is built once per table version and shared by every
stream: a node of 8 x 141 GiB cards has about a hundred thousand devices even at a coarse unit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from gpushare.model import contract
from gpushare.model.allocation import NoCandidate
from gpushare.model.devices import memory_device_ids
from gpushare.model.request import GpuKind
from gpushare_plugin._proto.v1beta1 import api_pb2, api_pb2_grpc
from gpushare_plugin.allocator import Allocator, PreferredRequest
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.metrics import PluginMetrics

OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


def list_response(table: DeviceTable, kind: GpuKind) -> api_pb2.ListAndWatchResponse:
    """Every device of `kind` with its health (and NUMA node where known)."""
    devices: list[api_pb2.Device] = []
    for card in table.cards:
        health = contract.HEALTHY if table.healthy(card) else contract.UNHEALTHY
        topology = (
            api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa_node)])
            if card.numa_node is not None
            else None
        )
        ids = (
            memory_device_ids(card.index, table.units(card))
            if kind is GpuKind.MEMORY
            else (card.uuid,)
        )
        devices.extend(api_pb2.Device(ID=i, health=health, topology=topology) for i in ids)
    return api_pb2.ListAndWatchResponse(devices=devices)


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self, *, kind: GpuKind, table: DeviceTable, allocator: Allocator, metrics: PluginMetrics
    ) -> None:
        self.kind = kind
        self._table = table
        self._allocator = allocator
        self._metrics = metrics
        self._cached: tuple[int, api_pb2.ListAndWatchResponse] | None = None

    def current(self) -> api_pb2.ListAndWatchResponse:
        version = self._table.version
        if self._cached is None or self._cached[0] != version:
            response = list_response(self._table, self.kind)
            self._cached = (version, response)
            healthy = sum(1 for d in response.devices if d.health == contract.HEALTHY)
            gauge = self._metrics.devices
            gauge.labels(self.kind.value, contract.HEALTHY).set(healthy)
            gauge.labels(self.kind.value, contract.UNHEALTHY).set(len(response.devices) - healthy)
        return self._cached[1]

    async def GetDevicePluginOptions(  # gRPC method names
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        seen = self._table.version
        yield self.current()
        while True:
            seen = await self._table.wait_newer(seen)
            yield self.current()

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        requests = [
            PreferredRequest(
                available=list(r.available_deviceIDs),
                must_include=list(r.must_include_deviceIDs),
                size=r.allocation_size,
            )
            for r in request.container_requests
        ]
        chosen = await self._allocator.preferred(self.kind, requests)
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        try:
            grants = await self._allocator.allocate(
                self.kind, [list(r.devices_ids) for r in request.container_requests]
            )
        except NoCandidate as refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs=grant.env,
                    mounts=[
                        api_pb2.Mount(
                            container_path=m.container_path,
                            host_path=m.host_path,
                            read_only=m.read_only,
                        )
                        for m in grant.mounts
                    ],
                    annotations=grant.annotations,
                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in grant.cdi_devices],
                )
                for grant in grants
            ]
        )

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

"""The kubelet-facing servicer on its own: what the kubelet's open ListAndWatch stream is sent
when a card's health changes, and what an Allocate the allocator cannot answer tells it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, NoReturn, cast

import grpc
import pytest

from gpushare.model import contract
from gpushare.model.allocation import NoCandidate
from gpushare.model.annotations import CardIndex
from gpushare.model.request import GpuKind
from gpushare_plugin._proto.v1beta1 import api_pb2
from gpushare_plugin.allocator import Allocator
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.base import DiscoveredCard
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.server import DevicePluginServicer

CARDS = [
    DiscoveredCard(index=CardIndex(0), uuid="GPU-a", model="m", memory_mib=1024),
    DiscoveredCard(index=CardIndex(1), uuid="GPU-b", model="m", memory_mib=1024, numa_node=1),
]


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Context:
    """What the servicer uses of grpc's context: abort ends the call with a status."""

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


class Refusing:
    """An allocator that refuses every Allocate with `refusal`."""

    def __init__(self, refusal: Exception) -> None:
        self.refusal = refusal

    async def allocate(self, kind: GpuKind, counts: list[int]) -> NoReturn:
        raise self.refusal


def servicer(
    kind: GpuKind,
    table: DeviceTable,
    metrics: PluginMetrics,
    refusal: Exception | None = None,
) -> DevicePluginServicer:
    allocator = cast(Allocator, Refusing(refusal or NoCandidate("no pod waits")))
    return DevicePluginServicer(kind=kind, table=table, allocator=allocator, metrics=metrics)


def health(response: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {device.ID: device.health for device in response.devices}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "on_b"), [(GpuKind.NUMBER, ["GPU-b"]), (GpuKind.MEMORY, ["1-0", "1-1"])]
)
async def test_a_card_gone_unhealthy_is_sent_on_the_open_stream_and_counted(
    kind: GpuKind, on_b: list[str]
) -> None:
    table = DeviceTable(node="n", cards=CARDS, unit_mib=512)
    metrics = PluginMetrics()
    stream = cast(
        AsyncGenerator[api_pb2.ListAndWatchResponse, None],
        servicer(kind, table, metrics).ListAndWatch(api_pb2.Empty(), cast(Any, Context())),
    )
    try:
        first = await anext(stream)
        assert set(health(first).values()) == {contract.HEALTHY}
        assert [d.topology.nodes[0].ID for d in first.devices if d.ID in on_b] == [1] * len(on_b)

        await table.set_unhealthy(frozenset({"GPU-b"}))
        second = await asyncio.wait_for(anext(stream), timeout=5)
    finally:
        await stream.aclose()
    assert [i for i, h in health(second).items() if h == contract.UNHEALTHY] == on_b
    assert len(second.devices) == len(first.devices)  # Unhealthy devices stay listed
    sample = metrics.registry.get_sample_value
    labels = {"resource": kind.value}
    assert sample("gpushare_plugin_devices", {**labels, "health": contract.UNHEALTHY}) == len(on_b)
    assert sample("gpushare_plugin_devices", {**labels, "health": contract.HEALTHY}) == len(
        first.devices
    ) - len(on_b)


@pytest.mark.asyncio
async def test_an_allocate_the_allocator_cannot_answer_fails_with_the_reason() -> None:
    table = DeviceTable(node="n", cards=CARDS, unit_mib=512)
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["0-0"])]
    )
    refusal = NoCandidate("no pod bound to node n waits for a container of 1")
    with pytest.raises(Aborted) as refused:
        await servicer(GpuKind.MEMORY, table, PluginMetrics(), refusal).Allocate(
            request, cast(Any, Context())
        )
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details == str(refusal)

"""The GPUNode status writer: only changed statuses are written, and at a bounded pace."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from builders import capacity_node, gpu_pod, gpunode_resource

from gpushare.kube.clock import rfc3339
from gpushare.model import PodUid, contract
from gpushare_operator.config import OperatorConfig
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.status import StatusWriter

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), status_write_rate=10)


class RecordingApi:
    """The calls the status writer makes, recorded (writes with the time they were made)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, float, Mapping[str, Any]]] = []
        self.node_events: list[tuple[str, str, str, str]] = []

    async def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.writes.append((name, time.monotonic(), status))

    async def post_node_event(
        self, node: str, *, event_type: str, reason: str, message: str
    ) -> None:
        self.node_events.append((node, event_type, reason, message))


def cluster(nodes: int) -> SchedulerCache:
    cache = SchedulerCache(config=lambda: CONFIG)
    for number in range(nodes):
        name = f"n{number}"
        node = capacity_node(name, 22356, 2)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
        cache.observe_node(node)
        cache.observe_gpunode(gpunode_resource(name, [11178, 11178]))
    return cache


def writer_of(
    cache: SchedulerCache,
    api: RecordingApi,
    *,
    config: OperatorConfig = CONFIG,
    metrics: SchedulerMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> StatusWriter:
    return StatusWriter(
        cache=cache,
        gangs=GangBook(),
        api=api,  # type: ignore[arg-type]
        metrics=metrics or SchedulerMetrics(),
        config=lambda: config,
        clock=clock,
    )


@pytest.mark.asyncio
async def test_statuses_are_written_at_the_configured_pace_and_only_when_they_change() -> None:
    cache, api = cluster(4), RecordingApi()
    writer = writer_of(cache, api)
    await writer.write_changed()
    assert [name for name, _, _ in api.writes] == ["n0", "n1", "n2", "n3"]
    times = [at for _, at, _ in api.writes]
    # 10 writes a second: a tenth of a second between two (sleep never wakes early).
    assert all(later - earlier >= 0.099 for earlier, later in itertools.pairwise(times))

    await writer.write_changed()  # nothing changed: nothing written
    assert len(api.writes) == 4

    cache.observe_pod(PodInfo.parse(gpu_pod("a", 6000, node="n2", index="1", uid="ua")))
    await writer.write_changed()
    name, _, status = api.writes[-1]
    assert (len(api.writes), name) == (5, "n2")
    assert status["cards"][1]["pods"] == ["default/a"]


@pytest.mark.asyncio
async def test_a_node_that_nvidias_plugin_also_advertises_is_flagged_once_with_the_fix() -> None:
    cache, api = cluster(2), RecordingApi()
    writer = writer_of(cache, api)
    await writer.write_changed()
    flags = {
        n: c for n, _, s in api.writes for c in s["conditions"] if c["type"] == "DoubleAdvertised"
    }
    assert {n: c["status"] for n, c in flags.items()} == {"n0": "False", "n1": "False"}
    assert api.node_events == []

    node = capacity_node("n1", 22356, 2)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "nvidia.com/gpu": "2"}
    cache.observe_node(node)
    await writer.write_changed()
    await writer.write_changed()  # still so: no second Event
    name, _, status = api.writes[-1]
    flag = next(c for c in status["conditions"] if c["type"] == "DoubleAdvertised")
    assert (name, flag["status"], flag["reason"]) == ("n1", "True", "NvidiaDevicePluginActive")
    assert "nvidia.com/gpu: 2" in flag["message"]
    assert [(n, kind, reason) for n, kind, reason, _ in api.node_events] == [
        ("n1", "Warning", "DoubleAdvertised")
    ]
    assert "nvidia.com/gpu.deploy.device-plugin=false" in api.node_events[0][3]


@pytest.mark.asyncio
async def test_a_sweep_over_many_nodes_lets_the_binds_run_while_it_goes() -> None:
    cache, api = cluster(1000), RecordingApi()
    writer = writer_of(cache, api, config=replace(CONFIG, status_write_rate=1_000_000))
    await writer.write_changed()  # every status written once
    turns = 0

    async def bind_loop() -> None:  # another task of the event loop, as the binds are
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(bind_loop())
    await asyncio.sleep(0)
    started = turns
    await writer.write_changed()  # nothing changed: nothing to write, nothing to wait for
    other.cancel()
    assert len(api.writes) == 1000
    assert turns - started >= 1000 // 128  # at least once per slice of the sweep


@pytest.mark.asyncio
async def test_a_plugin_whose_heartbeat_stops_is_shown_stale_though_nothing_else_changed() -> None:
    cache, api = cluster(1), RecordingApi()
    beat = 1_800_000_000.0
    resource = gpunode_resource("n0", [11178, 11178])
    resource["metadata"]["annotations"] = {contract.PLUGIN_HEARTBEAT: rfc3339(beat)}
    cache.observe_gpunode(resource)
    now = [beat + 1]
    writer = writer_of(cache, api, clock=lambda: now[0])
    await writer.write_changed()
    now[0] = beat + CONFIG.plugin_stale_after_s + 1
    await writer.write_changed()
    shown = [{c["type"]: c["status"] for c in status["conditions"]} for _, _, status in api.writes]
    assert [(s["Ready"], s["Stale"]) for s in shown] == [("True", "False"), ("False", "True")]


@pytest.mark.asyncio
async def test_a_cards_allocated_bytes_follow_its_pods() -> None:
    cache, api, metrics = cluster(1), RecordingApi(), SchedulerMetrics()
    writer = writer_of(cache, api, metrics=metrics)

    def allocated() -> float | None:
        return metrics.registry.get_sample_value(
            "gpushare_card_allocated_bytes", {"node": "n0", "card": "1"}
        )

    await writer.write_changed()
    assert allocated() == 0
    cache.observe_pod(PodInfo.parse(gpu_pod("a", 6000, node="n0", index="1", uid="ua")))
    await writer.write_changed()
    assert allocated() == 6000 * 2**20
    cache.forget_pod(PodUid("ua"))
    await writer.write_changed()
    assert allocated() == 0

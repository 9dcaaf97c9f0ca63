"""The operator's runtime against a scripted apiserver (no socket): it lists every kind, then
leads; a pending GPU pod is bound once the cache holds its node; a task that fails with an
error nothing handled stops the operator once, naming the task."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from scripted import Answer

from gpushare.model.usage import PodRef
from gpushare_operator.config import OperatorConfig
from gpushare_operator.runtime import Runtime

pytestmark = pytest.mark.asyncio

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), leader_elect=False)


class Apiserver:
    """Lists what `objects` holds per resource (nothing else); every watch stays quiet. Binds
    are recorded; the other writes (events, statuses) are answered and forgotten."""

    def __init__(self, objects: Mapping[str, list[dict[str, Any]]]) -> None:
        self.objects = objects
        self.bound: list[tuple[str, str]] = []
        self.was_bound = asyncio.Event()

    def lister(self, resource: str) -> Any:
        async def call(**params: Any) -> Answer:
            if params.get("watch"):
                await asyncio.Event().wait()
            items = self.objects.get(resource, [])
            return Answer(200, {"metadata": {"resourceVersion": "1"}, "items": items})

        return call

    async def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> None:
        self.bound.append((pod.name, node))
        self.was_bound.set()

    def __getattr__(self, name: str) -> Any:
        async def answered(*args: Any, **kwargs: Any) -> str:
            return "answered"

        return answered


async def running(runtime: Runtime) -> None:
    runtime.start()
    await asyncio.wait_for(runtime.synced.wait(), 5)


async def test_a_pending_gpu_pod_is_bound_once_the_cache_holds_its_node() -> None:
    apiserver = Apiserver(
        {"nodes": [ready_node("n", 20000, 2)], "pods": [gpu_pod("train", 6000, uid="u1")]}
    )
    runtime = Runtime(config=CONFIG, api=apiserver, on_failure=lambda: None)
    try:
        await running(runtime)
        await asyncio.wait_for(apiserver.was_bound.wait(), 5)
    finally:
        await runtime.stop()
    assert apiserver.bound == [("train", "n")]
    assert runtime.failure is None


async def test_a_task_failing_with_an_unhandled_error_stops_the_operator_once() -> None:
    stops: list[str] = []
    runtime = Runtime(
        config=CONFIG,
        api=Apiserver({}),
        on_failure=lambda: stops.append("stop"),
    )

    async def broken() -> None:
        raise RuntimeError("a bug")

    try:
        await running(runtime)
        runtime.spawn(broken(), "broken")
        runtime.spawn(broken(), "broken too")
        for _ in range(100):
            await asyncio.sleep(0)
    finally:
        await runtime.stop()
    assert stops == ["stop"]
    assert runtime.failure == "broken: RuntimeError('a bug')"

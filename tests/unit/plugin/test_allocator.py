"""Allocate's record of what it served, with the kubelet admitting pods while the plugin's
writes are in flight: every container is started with its own pod's card.

The kubelet's Allocate names device ids, not the pod; two pods of one request on one card get
the same grant, so the plugin may serve one under the other's name and must then follow the
kubelet (`PodCache._admitted`). These tests script the apiserver's answers and the watch
events' timing that a 1,000-pod burst produced."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import gpu_pod

from gpushare.kube import ApiError
from gpushare.model import contract
from gpushare.model.allocation import NoCandidate
from gpushare.model.bound import bound_pod
from gpushare.model.device_list import DeviceListing
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodRef
from gpushare_plugin.allocator import Allocator
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache

UNITS = 16


class Api:
    """The plugin's writes: each `mark_assigned` waits until the test lets it answer."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[Exception | None] = asyncio.Queue()
        self.writing = asyncio.Event()
        self.marked: list[str] = []

    def pod_lister(self, node: str) -> Any:
        return lambda **_: None

    async def mark_assigned(self, pod: PodRef, resource_version: str | None) -> None:
        self.writing.set()
        answer = await self.answers.get()
        self.writing.clear()
        if answer is not None:
            raise answer
        self.marked.append(pod.name)

    async def read_pod(self, pod: PodRef) -> dict[str, Any] | None:
        return None


def pod(name: str, at: int, *, card: str, admitted: bool = False, assigned: bool = False) -> Any:
    body = gpu_pod(name, UNITS, node="n", index=card, uid=name)
    body["metadata"]["annotations"][contract.PREDICATE_TIME] = str(at)
    if assigned:
        body["metadata"]["annotations"][contract.GPU_ASSIGNED] = "true"
    if admitted:
        body["status"]["containerStatuses"] = [{"name": "cuda-container"}]
    return bound_pod(body)


def plugin(tmp_path: Path, *pods: Any) -> tuple[Allocator, PodCache, Api]:
    spec = tmp_path / "cards.yaml"
    spec.write_text(yaml.safe_dump({"cards": [{"memoryMiB": 1024}, {"memoryMiB": 1024}]}))
    table = DeviceTable(node="n", cards=FakeDiscovery(f"@{spec}", node="n").cards(), unit_mib=1)
    api = Api()
    cache = PodCache(api, "n")  # type: ignore[arg-type]
    cache._listed(set(), "1")
    cache.synced.set()
    for each in pods:
        cache._apply("ADDED", each)
    allocator = Allocator(
        table=table,
        pods=cache,
        api=api,  # type: ignore[arg-type]
        metrics=PluginMetrics(),
        listing=DeviceListing(),
        limits=None,
        wait_s=0.2,
        schedulers=frozenset({contract.DEFAULT_SCHEDULER_NAME}),
    )
    return allocator, cache, api


async def allocate(allocator: Allocator, api: Api) -> tuple[str, str]:
    """One call whose write the apiserver takes: (pod served, card told)."""
    await api.answers.put(None)
    (grant,) = await allocator.allocate(GpuKind.MEMORY, [UNITS])
    return grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]


@pytest.mark.asyncio
async def test_a_pod_admitted_while_its_write_is_in_flight_leaves_its_neighbours_their_cards(
    tmp_path: Path,
) -> None:
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"), pod("b", 2, card="0"))
    # The kubelet starts "b" first; the plugin serves the oldest, "a" (same card, same env).
    assert await allocate(allocator, api) == ("a", "0")
    # The kubelet's call for "a" is served under "b"'s name; "b" is admitted while that
    # call's gpu-assigned write is still on its way.
    call = asyncio.create_task(allocator.allocate(GpuKind.MEMORY, [UNITS]))
    await api.writing.wait()
    cache._apply("MODIFIED", pod("b", 2, card="0", admitted=True))
    await api.answers.put(None)
    (grant,) = await call
    assert (grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]) == ("b", "0")
    # Both have their grants ("a" is admitted later): a pod of the same request bound to
    # card 1 (the operator saw both marked) gets card 1.
    cache._apply("ADDED", pod("c", 3, card="1"))
    assert await allocate(allocator, api) == ("c", "1")
    cache._apply("MODIFIED", pod("a", 1, card="0", admitted=True))
    assert api.marked == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_refused_call_leaves_the_pod_to_be_served_by_the_kubelets_retry(
    tmp_path: Path,
) -> None:
    allocator, _, api = plugin(tmp_path, pod("a", 1, card="0"))
    await api.answers.put(ApiError(403, 'pods "a" is forbidden'))
    with pytest.raises(NoCandidate, match=r"could not set volcano\.sh/gpu-assigned"):
        await allocator.allocate(GpuKind.MEMORY, [UNITS])
    assert await allocate(allocator, api) == ("a", "0")


@pytest.mark.asyncio
async def test_a_pod_admitted_during_a_refused_call_took_a_grant_served_under_another_name(
    tmp_path: Path,
) -> None:
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"), pod("b", 2, card="0"))
    assert await allocate(allocator, api) == ("a", "0")  # the kubelet was starting "b"
    call = asyncio.create_task(allocator.allocate(GpuKind.MEMORY, [UNITS]))
    await api.writing.wait()
    cache._apply("MODIFIED", pod("b", 2, card="0", admitted=True))
    await api.answers.put(ApiError(403, 'pods "b" is forbidden'))
    with pytest.raises(NoCandidate):
        await call
    # "b" runs on the grant served as "a": "a" is served again when the kubelet retries it.
    assert await allocate(allocator, api) == ("a", "0")


@pytest.mark.asyncio
async def test_a_pod_deleted_while_its_grant_is_written_does_not_fail_its_neighbours_start(
    tmp_path: Path,
) -> None:
    allocator, _, api = plugin(tmp_path, pod("a", 1, card="0"), pod("b", 2, card="0"))
    # The kubelet starts "b"; "a", matched first, was deleted a moment ago (its watch event
    # is still on its way): the write says so, and the call is served as "b".
    await api.answers.put(ApiError(404, 'pods "a" not found'))
    assert await allocate(allocator, api) == ("b", "0")
    assert api.marked == ["b"]


@pytest.mark.asyncio
async def test_a_pod_admitted_with_an_answered_grant_never_takes_one_still_being_written(
    tmp_path: Path,
) -> None:
    allocator, cache, api = plugin(tmp_path, pod("b", 2, card="0"), pod("c", 3, card="0"))
    # The kubelet starts "c"; the plugin serves the oldest it knows, "b".
    assert await allocate(allocator, api) == ("b", "0")
    # "a", bound before "b", reaches the watch cache late; the kubelet's next call (for "b")
    # is served as "a", and while that write is out, "c" is admitted with "b"'s grant.
    cache._apply("ADDED", pod("a", 1, card="0"))
    call = asyncio.create_task(allocator.allocate(GpuKind.MEMORY, [UNITS]))
    await api.writing.wait()
    cache._apply("MODIFIED", pod("c", 3, card="0", admitted=True))
    await api.answers.put(None)
    (grant,) = await call
    assert grant.pod.name == "a"
    cache._apply("MODIFIED", pod("a", 1, card="0", assigned=True))  # the write, watched
    # The kubelet has served "b" (under "a"'s name) and "c" (under "b"'s): "a" is the one
    # still to come, and gets card 0, not card 1 where a pod of its size was bound since.
    cache._apply("ADDED", pod("d", 4, card="1"))
    assert await allocate(allocator, api) == ("b", "0")

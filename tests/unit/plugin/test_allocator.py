"""Allocate's record of what it served and the gpu-assigned marks, with the kubelet starting
pods in its own order: every container is started with its own pod's card; the kubelet's
pod-resources records, when they name the pod being admitted, serve it under its own name and
mark it at once.

The kubelet's Allocate names device ids, not the pod; two pods of one request on one card get
the same grant, so the plugin may serve one under the other's name and must then follow the
kubelet (`PodCache._admitted`), marking only pods it has seen admitted. These tests script the
apiserver's answers and the watch events' order that a 1,000-pod burst with faults produced,
and the kubelet's calls over the plugin's socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import structlog.testing
import yaml
from builders import gpu_pod
from scripted import Answer

from gpushare.kube import ApiError
from gpushare.kube.retry import Backoff, RetryPolicy
from gpushare.model import contract
from gpushare.model.allocation import NoCandidate
from gpushare.model.bound import bound_pod
from gpushare.model.device_list import DeviceListing
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodRef
from gpushare_plugin import allocator as allocator_module
from gpushare_plugin import podresources as podresources_module
from gpushare_plugin._proto.podresources_v1 import api_pb2 as records_pb2
from gpushare_plugin._proto.podresources_v1 import api_pb2_grpc as records_grpc
from gpushare_plugin._proto.v1beta1 import api_pb2, api_pb2_grpc
from gpushare_plugin.allocator import Allocator, PreferredRequest
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache
from gpushare_plugin.podresources import PodResources
from gpushare_plugin.server import DevicePluginServicer

UNITS = 16


class Api:
    """The plugin's one pod write; `answers` scripts the errors the next ones get,
    `refusals` the error each write for a pod gets."""

    def __init__(self, *answers: Exception) -> None:
        self.answers = list(answers)
        self.refusals: dict[str, Exception] = {}
        self.marked: list[str] = []
        self.wrote = asyncio.Event()

    def pod_lister(self, node: str) -> Any:
        return lambda **_: None

    async def mark_assigned(self, pod: PodRef) -> None:
        if pod.name in self.refusals:
            raise self.refusals[pod.name]
        if self.answers:
            raise self.answers.pop(0)
        self.marked.append(pod.name)
        self.wrote.set()


def pod(name: str, at: int, *, card: str, admitted: bool = False, phase: str = "") -> Any:
    body = gpu_pod(name, UNITS, node="n", index=card, uid=name)
    body["metadata"]["annotations"][contract.PREDICATE_TIME] = str(at)
    if admitted:
        body["status"]["containerStatuses"] = [{"name": "cuda-container"}]
    if phase:
        body["status"]["phase"] = phase
    return bound_pod(body)


class QuietWatch(Api):
    """An apiserver whose watches go quiet at once (a half-open connection); its LISTs of the
    node's pods answer `listings` in turn (the last one again once they run out)."""

    def __init__(self, *listings: list[dict[str, Any]]) -> None:
        super().__init__()
        self.listings = list(listings)
        self.lists = 0

    def pod_lister(self, node: str) -> Any:
        async def call(**params: Any) -> Answer:
            if params.get("watch"):
                await asyncio.Event().wait()
            self.lists += 1
            items = self.listings[min(self.lists, len(self.listings)) - 1]
            return Answer(200, {"metadata": {"resourceVersion": str(self.lists)}, "items": items})

        return call


def plugin(
    tmp_path: Path,
    *pods: Any,
    wait_s: float = 0.2,
    api: Api | None = None,
    records: PodResources | None = None,
    identifies_pods: bool = False,
) -> tuple[Allocator, PodCache, Api]:
    """An allocator over two 1024-unit cards; its pod cache holds `pods`, or, given an `api`,
    what that apiserver lists once the cache runs; `records`: the kubelet's to ask;
    `identifies_pods`: what its GPUNode told the operator."""
    spec = tmp_path / "cards.yaml"
    spec.write_text(yaml.safe_dump({"cards": [{"memoryMiB": 1024}, {"memoryMiB": 1024}]}))
    table = DeviceTable(node="n", cards=FakeDiscovery(f"@{spec}", node="n").cards(), unit_mib=1)
    table.identifies_pods = identifies_pods
    listed_here = api is None
    api = api or Api()
    cache = PodCache(api, "n")  # type: ignore[arg-type]
    if listed_here:
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
        wait_s=wait_s,
        schedulers=frozenset({contract.DEFAULT_SCHEDULER_NAME}),
        kubelet_records=records,
    )
    return allocator, cache, api


async def allocate(allocator: Allocator, ids: list[str] | None = None) -> tuple[str, str]:
    """One call of the kubelet with `ids` (UNITS of them): (pod served, card told)."""
    (grant,) = await allocator.allocate(GpuKind.MEMORY, [ids or [f"0-{i}" for i in range(UNITS)]])
    return grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]


async def marked(allocator: Allocator, api: Api, count: int) -> list[str]:
    """What the marker wrote once `count` pods are marked."""
    marking = asyncio.create_task(allocator.mark_started())
    try:
        async with asyncio.timeout(10):
            while len(api.marked) < count:
                api.wrote.clear()
                await api.wrote.wait()
    finally:
        marking.cancel()
        await asyncio.gather(marking, return_exceptions=True)
    return api.marked


@pytest.mark.asyncio
async def test_a_pod_is_marked_assigned_once_the_kubelet_admitted_it_not_when_served(
    tmp_path: Path,
) -> None:
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"))
    assert await allocate(allocator) == ("a", "0")
    assert cache.to_mark.empty()  # served: not yet known to be the pod the kubelet started
    assert api.marked == []
    cache._apply("MODIFIED", pod("a", 1, card="0", admitted=True))
    assert await marked(allocator, api, 1) == ["a"]


@pytest.mark.asyncio
async def test_pods_started_in_another_order_than_served_each_run_on_their_cards_grant(
    tmp_path: Path,
) -> None:
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"), pod("b", 2, card="0"))
    # The kubelet starts "b"; the call names no pod and is served as the oldest, "a" (the
    # same card and env: the operator keeps unmarked pods of one request on one card).
    assert await allocate(allocator) == ("a", "0")
    cache._apply("MODIFIED", pod("b", 2, card="0", admitted=True))
    assert await marked(allocator, api, 1) == ["b"]  # "a" has not started: still unmarked
    # "a" is served again when the kubelet starts it, whatever pods of its request were
    # bound since (on its card: the exactness rule holds the others back while it waits).
    cache._apply("ADDED", pod("c", 3, card="0"))
    assert await allocate(allocator) == ("a", "0")


@pytest.mark.asyncio
async def test_starts_go_on_while_the_apiserver_is_away_and_the_marks_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each write tried twice, then queued again: five 503s outlast two rounds of tries.
    monkeypatch.setattr(allocator_module, "WRITE", RetryPolicy("write", Backoff(0.01, 0.01), 2))
    monkeypatch.setattr(allocator_module, "MARK_AGAIN_S", 0.01)
    away = ApiError(503, "the apiserver is shutting down")
    # Just started, it answers forbidden until its RBAC caches are filled.
    starting = ApiError(403, 'pods "a" is forbidden: User "system:serviceaccount:..."')
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"))
    api.answers = [*[away] * 5, *[starting] * 3]
    assert await allocate(allocator) == ("a", "0")
    cache._apply("MODIFIED", pod("a", 1, card="0", admitted=True))
    assert await marked(allocator, api, 1) == ["a"]
    assert api.answers == []


@pytest.mark.asyncio
async def test_a_mark_refused_for_good_or_for_a_pod_gone_is_dropped(tmp_path: Path) -> None:
    allocator, cache, api = plugin(tmp_path, pod("a", 1, card="0"), pod("b", 2, card="0"))
    api.refusals["a"] = ApiError(404, 'pods "a" not found')
    cache._apply("MODIFIED", pod("a", 1, card="0", admitted=True))
    cache._apply("MODIFIED", pod("b", 2, card="0", admitted=True))
    cache._apply("DELETED", pod("b", 2, card="0", admitted=True))  # before its mark
    cache._apply("ADDED", pod("c", 3, card="0", admitted=True))
    assert await marked(allocator, api, 1) == ["c"]
    assert cache.to_mark.empty()  # "a" refused, "b" gone: neither queued again


@contextlib.asynccontextmanager
async def on_its_socket(tmp_path: Path, allocator: Allocator) -> AsyncIterator[Any]:
    """The allocator's gpu-memory servicer on a unix socket: the kubelet's stub of it."""
    server = grpc.aio.server()
    servicer = DevicePluginServicer(
        kind=GpuKind.MEMORY, table=allocator._table, allocator=allocator, metrics=PluginMetrics()
    )
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    socket = tmp_path / "memory.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    finally:
        await server.stop(None)


async def kubelet_prefers(kubelet: Any, available: list[str]) -> list[str]:
    """The kubelet's GetPreferredAllocation over the socket for one container of UNITS."""
    preferred = await kubelet.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, allocation_size=UNITS
                )
            ]
        )
    )
    return list(preferred.container_responses[0].deviceIDs)


async def kubelet_allocates(kubelet: Any, ids: list[str]) -> api_pb2.AllocateResponse:
    """The kubelet's Allocate over the socket for one container of `ids`."""
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )
    answer: api_pb2.AllocateResponse = await kubelet.Allocate(request)
    return answer


@pytest.mark.asyncio
async def test_the_kubelet_is_steered_to_the_granted_card_and_told_a_refusal_s_reason(
    tmp_path: Path,
) -> None:
    """The kubelet's calls over the plugin's socket: GetPreferredAllocation names ids on the
    pod's card, Allocate gives its env, an Allocate no pod waits for fails with the reason."""
    allocator, _, _ = plugin(tmp_path, pod("a", 1, card="1"))
    async with on_its_socket(tmp_path, allocator) as kubelet:
        listed = await anext(kubelet.ListAndWatch(api_pb2.Empty()).__aiter__())
        chosen = await kubelet_prefers(kubelet, [d.ID for d in listed.devices])
        assert {i.split("-")[0] for i in chosen} == {"1"}
        answer = await kubelet_allocates(kubelet, chosen)
        assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "1"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet_allocates(kubelet, chosen)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod bound to node n waits for a container of 16" in str(refused.value.details())


@pytest.mark.asyncio
async def test_a_start_before_the_plugin_listed_the_pods_is_refused_with_what_happens_and_the_fix(
    tmp_path: Path,
) -> None:
    # The plugin just started and its LIST of the node's pods has not come back (a slow or
    # unreachable apiserver): the kubelet is given its own ids to prefer, then Allocate
    # refuses the pod, saying what becomes of it and what to do.
    allocator, _, _ = plugin(tmp_path, wait_s=0.1, api=Api())
    async with on_its_socket(tmp_path, allocator) as kubelet:
        assert await kubelet_prefers(kubelet, GRANT) == GRANT
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet_allocates(kubelet, GRANT)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    told = str(refused.value.details())
    assert "the device plugin on node n has not read the pods bound there" in told
    assert "the kubelet fails the pod (UnexpectedAdmissionError) and does not try it again" in told
    assert "'pods on node listed'" in told


@pytest.mark.asyncio
async def test_with_no_allocate_wait_a_pod_the_watch_shows_is_served(tmp_path: Path) -> None:
    allocator, _, _ = plugin(tmp_path, pod("a", 1, card="1"), wait_s=0)
    assert await allocate(allocator) == ("a", "1")


@pytest.mark.asyncio
async def test_a_whole_card_pod_is_served_whatever_stray_memory_annotation_it_carries(
    tmp_path: Path,
) -> None:
    # The memory annotations mean something only on gpu-memory pods: the operator places a
    # gpu-number pod whatever they say, so the plugin serves it.
    whole = gpu_pod("whole", number=1, node="n", index="1", uid="whole")
    whole["metadata"]["annotations"][contract.GPU_MEMORY_MIB] = "cuda-container=1024"
    allocator, _, _ = plugin(tmp_path, bound_pod(whole), wait_s=3600)
    card = allocator._table.cards[1]
    async with asyncio.timeout(5):
        (grant,) = await allocator.allocate(GpuKind.NUMBER, [[card.uuid]])
    assert (grant.pod.name, grant.env["NVIDIA_VISIBLE_DEVICES"]) == ("whole", "1")


@pytest.mark.asyncio
async def test_a_pod_whose_memory_record_was_edited_out_of_shape_is_refused_at_once_saying_so(
    tmp_path: Path,
) -> None:
    edited = gpu_pod("edited", UNITS, node="n", index="0", uid="edited")
    edited["metadata"]["annotations"][contract.GPU_MEMORY_MIB] = "cuda-container=1024"
    allocator, _, _ = plugin(tmp_path, bound_pod(edited), wait_s=3600)
    async with asyncio.timeout(5):
        with pytest.raises(NoCandidate) as refused:
            await allocate(allocator)
    assert str(refused.value) == (
        f"refusing pod default/edited: annotation {contract.MEMORY_UNIT_MIB}=None is not a "
        f"whole number of MiB; delete the pod and create it again (the gpushare admission "
        f"webhook writes both)"
    )


@pytest.mark.asyncio
async def test_a_pod_whose_card_the_node_lacks_is_refused_at_once_not_after_the_grace(
    tmp_path: Path,
) -> None:
    # The watch's grace is for a pod not yet in the cache; this one is there, and its
    # placement annotations cannot change: waiting would only hold the node's admissions.
    allocator, _, _ = plugin(tmp_path, pod("lost", 1, card="9"), wait_s=3600)
    async with asyncio.timeout(5):
        with pytest.raises(NoCandidate, match="card 9, which the node does not have"):
            await allocate(allocator)


@pytest.mark.asyncio
async def test_a_pod_the_quiet_watch_never_shows_is_listed_within_the_grace(
    tmp_path: Path,
) -> None:
    # The kubelet admits a pod bound after the plugin's watch went quiet: waiting out the
    # whole grace would refuse it; half way, the node's pods are listed again.
    late = gpu_pod("late", UNITS, node="n", index="0", uid="late")
    late["metadata"]["annotations"][contract.PREDICATE_TIME] = "1"
    apiserver = QuietWatch([], [late])
    allocator, cache, _ = plugin(tmp_path, wait_s=1, api=apiserver)
    running = asyncio.create_task(cache.run())
    try:
        assert await allocate(allocator) == ("late", "0")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert apiserver.lists == 2


@pytest.mark.asyncio
async def test_a_start_s_wait_for_the_watch_is_told_in_the_log_with_each_call_s_time(
    tmp_path: Path,
) -> None:
    # bench/realnode.py reads these to say where a GPU pod's start goes. The kubelet asks for
    # preferred ids, then allocates: for a pod the watch delivers late, the first call waits
    # (and says so), the second finds it at once; a pod already there waits for nothing.
    allocator, cache, _ = plugin(tmp_path, pod("early", 1, card="0"), wait_s=5)
    asked = [PreferredRequest(available=[], must_include=[], size=UNITS)]
    with structlog.testing.capture_logs() as logged:
        await allocate(allocator)
        preferring = asyncio.create_task(allocator.preferred(GpuKind.MEMORY, asked))
        await asyncio.sleep(0.2)
        cache._apply("ADDED", pod("late", 2, card="1"))
        await preferring
        await allocate(allocator)
    preferred = {e["pod"]: e for e in logged if e["event"] == "devices preferred"}
    allocated = {e["pod"]: e for e in logged if e["event"] == "container allocated"}
    assert allocated["default/early"]["watch_wait_ms"] < 100
    assert preferred["default/late"]["watch_wait_ms"] >= 200
    assert preferred["default/late"]["preferred_ms"] >= preferred["default/late"]["watch_wait_ms"]
    assert allocated["default/late"]["watch_wait_ms"] < 100
    assert allocated["default/late"]["allocate_ms"] >= allocated["default/late"]["lock_wait_ms"]


class Kubelet(records_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources `List`, as 1.36 answers it: `known` maps the pods in its pod
    manager to the ids their container holds (none: being admitted, or not yet recorded).
    `broken`: every call fails with this code."""

    def __init__(self) -> None:
        self.known: dict[str, list[str]] = {}
        self.broken: grpc.StatusCode | None = None
        self.asked = 0

    async def List(  # the gRPC method's name
        self,
        request: records_pb2.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> records_pb2.ListPodResourcesResponse:
        self.asked += 1
        if self.broken is not None:
            await context.abort(self.broken, "scripted")
        return records_pb2.ListPodResourcesResponse(
            pod_resources=[
                records_pb2.PodResources(
                    name=name,
                    namespace="default",
                    containers=[
                        records_pb2.ContainerResources(
                            name="cuda-container",
                            devices=[
                                records_pb2.ContainerDevices(
                                    resource_name=contract.GPU_MEMORY, device_ids=ids
                                )
                            ]
                            if ids
                            else [],
                        )
                    ],
                )
                for name, ids in self.known.items()
            ]
        )


@pytest_asyncio.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[tuple[Kubelet, PodResources]]:
    """A scripted kubelet, and the plugin's client of its records (closed after the test)."""
    scripted = Kubelet()
    server = grpc.aio.server()
    records_grpc.add_PodResourcesListerServicer_to_server(scripted, server)  # type: ignore[no-untyped-call]
    socket = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    records = PodResources(socket, "n")
    try:
        yield scripted, records
    finally:
        await records.close()
        await server.stop(None)


GRANT = [f"0-{i}" for i in range(UNITS)]


def one_request_on_two_cards(
    tmp_path: Path, records: PodResources, *, identifies_pods: bool = True, wait_s: float = 0.2
) -> tuple[Allocator, PodCache, Api]:
    """Pods "a" (card 0) and "b" (card 1) of one request, on a node whose GPUNode told the
    operator that its plugin identifies pods (unless told otherwise)."""
    return plugin(
        tmp_path,
        pod("a", 1, card="0"),
        pod("b", 2, card="1"),
        records=records,
        identifies_pods=identifies_pods,
        wait_s=wait_s,
    )


async def prefer(allocator: Allocator) -> list[str]:
    """The kubelet's GetPreferredAllocation with every unit of both cards free."""
    available = [f"{card}-{unit}" for card in (0, 1) for unit in range(2 * UNITS)]
    asked = [PreferredRequest(available=available, must_include=[], size=UNITS)]
    (ids,) = await allocator.preferred(GpuKind.MEMORY, asked)
    return ids


@pytest.mark.asyncio
async def test_the_pod_the_kubelet_is_admitting_gets_its_own_card_and_is_marked_at_once(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    scripted, records = kubelet
    allocator, _, api = one_request_on_two_cards(tmp_path, records, identifies_pods=False)
    scripted.known = {"b": []}  # admitting "b", the younger; "a" not yet known
    with structlog.testing.capture_logs() as logged:
        assert await allocate(allocator) == ("b", "1")
    assert await marked(allocator, api, 1) == ["b"]  # before its status shows it admitted
    (allocated,) = [e for e in logged if e["event"] == "container allocated"]
    assert allocated["identified"] is True


@pytest.mark.asyncio
async def test_pods_of_one_request_on_different_cards_start_in_any_order_each_on_its_own(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    scripted, records = kubelet
    allocator, _, api = plugin(
        tmp_path,
        pod("a", 1, card="0"),
        pod("b", 2, card="1"),
        pod("c", 3, card="0"),
        records=records,
        identifies_pods=True,
    )
    started = []
    for name in ("c", "b", "a"):  # the kubelet's own order
        scripted.known[name] = []
        started.append(await allocate(allocator))
        scripted.known[name] = GRANT
    assert started == [("c", "0"), ("b", "1"), ("a", "0")]
    assert sorted(await marked(allocator, api, 3)) == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_pod_the_kubelet_admits_before_the_watch_shows_it_waits_for_the_watch(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    scripted, records = kubelet
    allocator, cache, _ = plugin(
        tmp_path, pod("a", 1, card="0"), records=records, identifies_pods=True, wait_s=5
    )
    scripted.known = {"late": []}
    starting = asyncio.create_task(allocate(allocator))
    await asyncio.sleep(0.1)
    assert not starting.done()  # "a" is not the pod being started: never served in its place
    cache._apply("ADDED", pod("late", 2, card="1"))
    assert await starting == ("late", "1")


@pytest.mark.asyncio
async def test_two_unstarted_pods_the_kubelet_knows_on_different_cards_get_no_card_on_a_guess(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    # A kubelet before 1.34 lists pods it rejected too: "b" was refused by another admission
    # check a moment ago, and its Failed status is on its way.
    scripted, records = kubelet
    allocator, cache, _ = one_request_on_two_cards(tmp_path, records, wait_s=5)
    scripted.known = {"a": [], "b": []}
    starting = asyncio.create_task(allocate(allocator))
    await asyncio.sleep(0.1)
    assert not starting.done()
    cache._apply("MODIFIED", pod("b", 2, card="1", phase="Failed"))
    assert await starting == ("a", "0")


@pytest.mark.asyncio
async def test_without_the_records_pods_of_one_request_on_different_cards_get_no_card(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node told the operator that its plugin identifies pods; the records then fail.
    scripted, records = kubelet
    monkeypatch.setattr(podresources_module, "QUIET_AFTER_FAILURE_S", 0.3)
    scripted.broken = grpc.StatusCode.UNAVAILABLE
    allocator, cache, _ = plugin(
        tmp_path,
        pod("a", 1, card="0"),
        pod("b", 2, card="1"),
        records=records,
        identifies_pods=True,
    )
    with pytest.raises(NoCandidate, match="hold different cards"):
        await allocate(allocator)
    cache._apply("DELETED", pod("b", 2, card="1"))
    with structlog.testing.capture_logs() as logged:
        assert await allocate(allocator) == ("a", "0")  # one card: the guess is safe
    (allocated,) = [e for e in logged if e["event"] == "container allocated"]
    assert allocated["identified"] is False


@pytest.mark.asyncio
async def test_records_that_cannot_be_read_are_asked_again_only_after_a_quiet_spell(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted, records = kubelet
    monkeypatch.setattr(podresources_module, "QUIET_AFTER_FAILURE_S", 0.3)
    allocator, cache, api = plugin(
        tmp_path,
        pod("a", 1, card="0"),
        pod("b", 2, card="0"),
        pod("c", 3, card="0"),
        records=records,
    )
    scripted.broken = grpc.StatusCode.UNAVAILABLE
    with structlog.testing.capture_logs() as logged:
        assert await allocate(allocator) == ("a", "0")
        assert await allocate(allocator) == ("b", "0")
    assert cache.to_mark.empty()  # guesses: marked once their status shows them admitted
    failed = [e for e in logged if e["event"] == "pod_resources_failed"]
    assert len(failed) == 1
    assert "UNAVAILABLE" in failed[0]["error"]
    assert "mount the kubelet's pod-resources folder" in failed[0]["fix"]
    assert scripted.asked == 1  # the second call, within the quiet spell: not asked
    await asyncio.sleep(0.35)
    scripted.broken = None
    scripted.known = {"c": []}
    assert await allocate(allocator) == ("c", "0")
    assert await marked(allocator, api, 1) == ["c"]


@pytest.mark.asyncio
async def test_the_kubelet_s_rate_limit_is_waited_out(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    scripted, records = kubelet
    allocator, _, api = one_request_on_two_cards(tmp_path, records, identifies_pods=False)
    scripted.broken = grpc.StatusCode.RESOURCE_EXHAUSTED
    scripted.known = {"b": []}

    async def limit_lifts() -> None:
        await asyncio.sleep(0.03)
        scripted.broken = None

    lifting = asyncio.create_task(limit_lifts())
    assert await allocate(allocator) == ("b", "1")
    await lifting
    assert await marked(allocator, api, 1) == ["b"]
    assert scripted.asked > 1


@pytest.mark.asyncio
async def test_the_records_are_read_once_at_start_up_to_say_whether_pods_are_identified(
    kubelet: tuple[Kubelet, PodResources],
) -> None:
    scripted, records = kubelet
    assert await records.readable()
    scripted.broken = grpc.StatusCode.UNAVAILABLE
    assert not await records.readable()
    missing = PodResources(Path("/nonexistent/kubelet.sock"), "n")
    assert not await missing.readable()
    await missing.close()


@pytest.mark.asyncio
async def test_a_rate_limit_longer_than_the_tries_holds_the_call_until_the_records_say(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    # Another client of the kubelet spends its tokens for half a second: pods of one request
    # on different cards are not guessed, nor refused, meanwhile.
    scripted, records = kubelet
    # No pod event comes: the records are read again on their own.
    allocator, _, _ = one_request_on_two_cards(tmp_path, records, wait_s=60)
    scripted.broken = grpc.StatusCode.RESOURCE_EXHAUSTED
    scripted.known = {"b": []}

    async def limit_lifts() -> None:
        await asyncio.sleep(0.5)
        scripted.broken = None

    lifting = asyncio.create_task(limit_lifts())
    async with asyncio.timeout(10):
        assert await allocate(allocator) == ("b", "1")
    await lifting


@pytest.mark.asyncio
async def test_an_allocate_of_the_ids_just_preferred_is_for_the_pod_the_records_named_then(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    # The kubelet asks GetPreferredAllocation, then Allocate, for one container in a row: the
    # records are read once for both. A call with other ids (no preference asked) reads them.
    scripted, records = kubelet
    allocator, _, _ = one_request_on_two_cards(tmp_path, records, identifies_pods=False)
    scripted.known = {"b": []}
    ids = await prefer(allocator)
    assert {device.split("-")[0] for device in ids} == {"1"}
    assert scripted.asked == 1
    assert await allocate(allocator, ids) == ("b", "1")
    assert scripted.asked == 1
    scripted.known = {"b": ids, "a": []}
    assert await allocate(allocator, GRANT) == ("a", "0")
    assert scripted.asked == 2


@pytest.mark.asyncio
async def test_a_later_container_s_allocate_of_the_ids_just_preferred_reads_the_records_once(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    scripted, records = kubelet
    body = gpu_pod("p", UNITS, node="n", index="1", uid="p")
    body["metadata"]["annotations"][contract.PREDICATE_TIME] = "1"
    body["spec"]["containers"].append(
        {"name": "second", "image": "x", "resources": {"limits": {contract.GPU_MEMORY: str(UNITS)}}}
    )
    allocator, _, _ = plugin(tmp_path, bound_pod(body), records=records)
    scripted.known = {"p": []}
    ids = await prefer(allocator)
    assert await allocate(allocator, ids) == ("p", "1")
    scripted.known = {"p": ids}  # its first container holds its devices now
    second = await prefer(allocator)
    assert scripted.asked == 2
    assert await allocate(allocator, second) == ("p", "1")
    assert scripted.asked == 2  # the Allocate of the ids just preferred reads nothing more


@pytest.mark.asyncio
async def test_a_pod_deleted_and_created_again_between_the_kubelet_s_two_calls_gets_no_card(
    tmp_path: Path, kubelet: tuple[Kubelet, PodResources]
) -> None:
    # A StatefulSet's pod: the kubelet asked for the old one's preferred ids; the new one of
    # that name is bound meanwhile, its own start still to come.
    scripted, records = kubelet
    allocator, cache, _ = plugin(tmp_path, pod("web-0", 1, card="1"), records=records)
    scripted.known = {"web-0": []}
    ids = await prefer(allocator)
    cache._apply("DELETED", pod("web-0", 1, card="1"))
    again = gpu_pod("web-0", UNITS, node="n", index="0", uid="web-0-again")
    again["metadata"]["annotations"][contract.PREDICATE_TIME] = "2"
    cache._apply("ADDED", bound_pod(again))
    with pytest.raises(NoCandidate, match="was deleted while the kubelet started it"):
        await allocate(allocator, ids)

"""Crashes, failover and bad input: nothing is lost, nothing is double-booked."""

from __future__ import annotations

import asyncio
import json
import random
import ssl
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from cluster import bound, create_pod, events_of, eventually, gpu_index, gpu_pod, list_pods
from cluster import unschedulable as unschedulable_message
from kubernetes_asyncio import client

from gpushare.model import contract, parse_quantity
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]
CARD_MIB = 11178


def is_unschedulable(pod: dict[str, Any]) -> bool:
    """Unschedulable for good: not merely held back behind a same-size pod that the device
    plugin has yet to assign (that wait ends by itself)."""
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and "held back until" not in c.get("message", "")
        for c in pod.get("status", {}).get("conditions", [])
    )


def assert_no_card_over_capacity(pods: list[dict[str, Any]], cards_per_node: int) -> None:
    used: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[tuple[str, int], int] = defaultdict(int)
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        index = gpu_index(pod)
        assert index is not None, f"{pod['metadata']['name']} bound without gpu-index"
        cards = [int(i) for i in index.split(",")]
        assert all(0 <= c < cards_per_node for c in cards)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        for card in cards:
            if contract.GPU_MEMORY in limits:
                used[node, card] += parse_quantity(
                    limits[contract.GPU_MEMORY], resource=contract.GPU_MEMORY, owner="test"
                )
            else:
                whole[node, card] += 1
    for key, mib in used.items():
        assert mib <= CARD_MIB, f"card {key} holds {mib} MiB > {CARD_MIB}"
        assert whole.get(key, 0) == 0, f"card {key} is shared with a whole-card pod"
    assert all(count == 1 for count in whole.values())


async def test_sigkill_during_a_burst_loses_nothing_and_double_books_nothing(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    nodes, cards = 10, 8
    for n in range(nodes):
        await create_gpu_node(
            core, FakeGpuNode(name=f"n{n:02d}", gpu_memory=cards * CARD_MIB, gpu_number=cards)
        )
    operator = start_operator()
    rng = random.Random(3)
    sizes = [1024, 2048, 4096, 6000]
    names = [f"burst-{i:03d}" for i in range(200)]
    limit = asyncio.Semaphore(16)

    async def create(name: str) -> None:
        async with limit:
            body = (
                gpu_pod(name, number=1) if rng.random() < 0.05 else gpu_pod(name, rng.choice(sizes))
            )
            await create_pod(core, body)

    assigner = asyncio.create_task(act_as_device_plugins(api))
    creating = asyncio.gather(*(create(name) for name in names))
    for already in (40, 100):  # kill it twice, mid-burst
        await eventually(
            lambda: _count_bound(core, at_least=already),  # noqa: B023 (awaited at once)
            timeout_s=60,
            what=f"{already} pods bound",
        )
        operator.kill()
        await asyncio.sleep(0.5)
        operator.start()
    await creating

    async def settled() -> list[dict[str, Any]] | None:
        pods = await list_pods(core)
        done = all(p["spec"].get("nodeName") or is_unschedulable(p) for p in pods)
        return pods if done and len(pods) == len(names) else None

    try:
        pods = await eventually(settled, timeout_s=120, what="every pod bound or unschedulable")
    finally:
        assigner.cancel()
        await asyncio.gather(assigner, return_exceptions=True)
    assert_no_card_over_capacity(pods, cards)
    for pod in pods:
        name = pod["metadata"]["name"]
        reasons = [e["reason"] for e in await events_of(core, name)]
        if pod["spec"].get("nodeName"):
            assert reasons.count("Scheduled") <= 1, f"{name} scheduled twice"
        else:
            assert "FailedScheduling" in reasons, f"{name} waits without a reason"
    assert sum(1 for p in pods if p["spec"].get("nodeName")) > 150


async def _count_bound(core: client.CoreV1Api, *, at_least: int) -> bool:
    pods = await list_pods(core)
    return sum(1 for p in pods if p["spec"].get("nodeName")) >= at_least


async def test_a_standby_takes_over_once_the_lease_runs_out(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=8 * CARD_MIB, gpu_number=8))
    first = start_operator("op-a")
    first.wait_logged("started_leading", timeout_s=10)
    second = start_operator("op-b")
    await create_pod(core, gpu_pod("before", 1024))
    await bound(core, "before")
    assert not any(line.get("event") == "started_leading" for line in second.log_events())
    assert not any(line.get("event") == "pod_bound" for line in second.log_events())

    first.kill()
    second.wait_logged("started_leading", timeout_s=15)  # once the 4 s Lease runs out
    await create_pod(core, gpu_pod("after", 1024))
    pod = await bound(core, "after")
    assert gpu_index(pod) == "0"  # the standby's warm cache knows card 0 holds "before"
    assert any(line.get("event") == "pod_bound" for line in second.log_events())


async def test_a_clean_shutdown_hands_over_at_once(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    # A 60 s Lease: a standby that leads within the wait below was handed the Lease, not
    # left to wait it out.
    lease = {"GPUSHARE_LEASE_DURATION": "60", "GPUSHARE_RENEW_DEADLINE": "40"}
    first = start_operator("op-a", **lease)
    first.wait_logged("started_leading", timeout_s=10)
    second = start_operator("op-b", **lease)
    assert first.stop() == 0
    second.wait_logged("started_leading", timeout_s=20)


async def test_bad_input_gets_a_clear_reason_and_harms_no_one_else(
    core: client.CoreV1Api, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="good", gpu_memory=CARD_MIB, gpu_number=1))
    await create_gpu_node(core, FakeGpuNode(name="odd-capacity", gpu_memory=1000, gpu_number=3))
    await create_gpu_node(
        core,
        FakeGpuNode(
            name="odd-health",
            gpu_memory=CARD_MIB,
            gpu_number=1,
            annotations={contract.GPU_UNHEALTHY_IDS: "0,,1"},
        ),
    )
    operator = start_operator()
    await create_pod(core, gpu_pod("gib", "1Gi"))
    await create_pod(core, gpu_pod("both", 1024, number=1))
    await create_pod(core, gpu_pod("fine", 1024))
    assert (await bound(core, "fine"))["spec"]["nodeName"] == "good"
    assert "uses a binary suffix" in await unschedulable_message(core, "gib")
    assert "asks for both volcano.sh/gpu-memory and volcano.sh/gpu-number" in (
        await unschedulable_message(core, "both")
    )
    for name in ("gib", "both"):
        warnings = [e for e in await events_of(core, name) if e["reason"] == "FailedScheduling"]
        assert len(warnings) == 1
    await create_pod(core, gpu_pod("big", 5000))
    await create_pod(core, gpu_pod("too-big", 20000))
    message = await unschedulable_message(core, "too-big")
    assert (
        "odd-capacity: node odd-capacity has capacity volcano.sh/gpu-memory=1000, not "
        "divisible by volcano.sh/gpu-number=3" in message
    )
    assert "odd-health: node odd-health: annotation volcano.sh/gpu-unhealthy-ids='0,,1'" in message
    assert (await bound(core, "big"))["spec"]["nodeName"] == "good"
    assert operator.running


WRITES = (b"POST ", b"PUT ", b"PATCH ", b"DELETE ")


class AnswerLosingProxy:
    """A TLS-terminating proxy in front of the apiserver (loopback) that, while `losing`,
    hangs up on every write without an answer, as an apiserver dying mid-request does: every
    other write is passed on first (it took effect; its caller never hears of it), the rest
    never arrive. Reads and watches pass, so the operator sees what happens."""

    def __init__(self, plane: ControlPlane, upstream_port: int) -> None:
        assert plane.pki is not None
        self.upstream_port = upstream_port
        self.serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.serving.load_cert_chain(plane.pki.serving_cert, plane.pki.serving_key)
        self.upstream = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
        self.upstream.load_cert_chain(plane.pki.admin_cert, plane.pki.admin_key)
        self.losing = False
        self.lost: list[bytes] = []
        self._connections: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", self.upstream_port, ssl=self.upstream
        )
        doomed: list[bytes] = []  # the request line of a write whose answer is to be lost

        async def requests() -> None:
            while data := await reader.read(65536):
                if self.losing and data.startswith(WRITES):
                    doomed.append(data.split(b"\r\n", 1)[0])
                    if len(self.lost) % 2:
                        self.lost.append(doomed[0])
                        return  # never arrives
                up_writer.write(data)
                await up_writer.drain()

        async def answers() -> None:
            while data := await up_reader.read(65536):
                if doomed:
                    self.lost.append(doomed[0])
                    return
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(requests()), asyncio.create_task(answers())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)  # a peer's hang-up: done
            for end in (writer, up_writer):
                end.close()
            self._connections.discard(task)

    async def close(self) -> None:
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)


@pytest_asyncio.fixture
async def losing_proxy(
    plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[tuple[AnswerLosingProxy, Path]]:
    """The proxy, and a kubeconfig that reaches the apiserver through it."""
    config = yaml.safe_load(plane.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    proxy = AnswerLosingProxy(plane, int(server.rsplit(":", 1)[1]))
    listening = await asyncio.start_server(proxy.serve, "127.0.0.1", 0, ssl=proxy.serving)
    port = listening.sockets[0].getsockname()[1]
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "through-proxy.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    yield proxy, kubeconfig
    listening.close()
    await proxy.close()
    await listening.wait_closed()


async def test_answers_lost_mid_request_stop_nothing_and_bind_no_pod_twice(
    api: client.ApiClient,
    core: client.CoreV1Api,
    losing_proxy: tuple[AnswerLosingProxy, Path],
    tmp_path: Path,
) -> None:
    """Binds, condition writes, Events, GPUNode status writes and Lease renewals whose answers
    are lost (the connection closes after the request went through): the operator keeps
    scheduling and reporting, and binds each pod once."""
    proxy, kubeconfig = losing_proxy
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=8 * CARD_MIB, gpu_number=8))
    operator = OperatorProcess(kubeconfig, tmp_path / "op.log", identity="op-lossy")
    # The proxy runs on this event loop: the harness's blocking waits go to a thread.
    await asyncio.to_thread(operator.start)
    assigner = asyncio.create_task(act_as_device_plugins(api))
    try:
        await asyncio.to_thread(operator.wait_logged, "started_leading", timeout_s=10)
        proxy.losing = True
        names = [f"lossy-{i:02d}" for i in range(12)]
        await asyncio.gather(*(create_pod(core, gpu_pod(name, 2048)) for name in names))
        await create_pod(core, gpu_pod("too-big", 2 * CARD_MIB))
        await asyncio.sleep(1.5)  # under the renew deadline: the leader stays the leader
        proxy.losing = False
        lost = b"\n".join(proxy.lost)
        assert b"/binding" in lost, lost
        await create_pod(core, gpu_pod("after", 1024))
        for name in [*names, "after"]:
            await bound(core, name, timeout_s=30)
        assert "0/1 nodes are available" in await unschedulable_message(core, "too-big")
        assert operator.running
        logged = operator.log_events()
        assert not [e for e in logged if e.get("event") == "task_failed"]
        # Every line is a JSON object, kopf's own (its start-up) among them.
        lines = operator.log.read_text().splitlines()
        assert [line for line in lines if not line.startswith("{")] == []
        assert {"kopf.activities.startup", "election"} <= {
            json.loads(line)["component"] for line in lines
        }
        binds = [e["pod"] for e in logged if e.get("event") == "pod_bound"]
        assert sorted(binds) == sorted({*binds})
        for name in [*names, "after"]:
            reasons = [e["reason"] for e in await events_of(core, name)]
            assert reasons.count("Scheduled") <= 1, name
    finally:
        assigner.cancel()
        await asyncio.gather(assigner, return_exceptions=True)
        await asyncio.to_thread(operator.stop)

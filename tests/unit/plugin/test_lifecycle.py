"""The plugin's life beside the kubelet, over unix sockets in a temporary folder with a
scripted kubelet: it registers both resources once kubelet.sock appears, again when a new
kubelet replaces it, and removes its sockets when stopped; a socket left by a crashed run is
reclaimed, one another live plugin serves is not taken."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml

from gpushare.model.request import GpuKind
from gpushare_plugin._proto.v1beta1 import api_pb2, api_pb2_grpc
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.lifecycle import KUBELET_SOCKET, SOCKET_NAMES, SocketBusy, Supervisor, reclaim
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.server import DevicePluginServicer

pytestmark = pytest.mark.asyncio


class Kubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's registration service: what each plugin told it."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, str]] = []

    async def Register(  # the gRPC method's name
        self, request: api_pb2.RegisterRequest, context: object
    ) -> api_pb2.Empty:
        self.registered.append((request.resource_name, request.endpoint))
        return api_pb2.Empty()


async def kubelet_serving(folder: Path) -> tuple[grpc.aio.Server, Kubelet]:
    kubelet = Kubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{folder / KUBELET_SOCKET}")
    await server.start()
    return server, kubelet


def servicers(tmp_path: Path) -> list[DevicePluginServicer]:
    spec = tmp_path / "cards.yaml"
    spec.write_text(yaml.safe_dump({"cards": [{"memoryMiB": 1024}]}))
    table = DeviceTable(node="n", cards=FakeDiscovery(f"@{spec}", node="n").cards(), unit_mib=1)
    return [
        DevicePluginServicer(
            kind=kind,
            table=table,
            allocator=None,  # type: ignore[arg-type]  # no Allocate here
            metrics=PluginMetrics(),
        )
        for kind in GpuKind
    ]


async def until(holds: Callable[[], bool]) -> None:
    for _ in range(200):
        if holds():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not within 10 s")


async def test_both_resources_are_registered_again_after_a_kubelet_restart_and_sockets_removed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "device-plugins"
    supervisor = Supervisor(socket_dir=folder, servicers=servicers(tmp_path))
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    sockets = [folder / SOCKET_NAMES[kind] for kind in GpuKind]
    try:
        await until(lambda: all(path.exists() for path in sockets))  # served before the kubelet
        assert supervisor.registrations == 0
        server, kubelet = await kubelet_serving(folder)
        await until(lambda: supervisor.registrations == 1)
        assert sorted(kubelet.registered) == sorted(
            (kind.value, SOCKET_NAMES[kind]) for kind in GpuKind
        )

        # A new kubelet serves a new kubelet.sock (the plugins' sockets left in place: the
        # file alone says a kubelet restarted).
        await server.stop(None)
        (folder / KUBELET_SOCKET).unlink(missing_ok=True)
        server, kubelet = await kubelet_serving(folder)
        await until(lambda: supervisor.registrations == 2)
        assert len(kubelet.registered) == 2
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await server.stop(None)
    assert not any(path.exists() for path in sockets)


async def test_a_socket_left_by_a_crash_is_reclaimed_and_a_live_one_is_not_taken(
    tmp_path: Path,
) -> None:
    stale = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(stale))
    listener.close()  # the file stays; nothing answers on it
    await reclaim(stale)
    assert not stale.exists()

    live = tmp_path / "live.sock"
    other = await asyncio.start_unix_server(lambda _r, w: w.close(), str(live))
    try:
        with pytest.raises(SocketBusy, match="another live process"):
            await reclaim(live)
        assert live.exists()
    finally:
        other.close()
        await other.wait_closed()

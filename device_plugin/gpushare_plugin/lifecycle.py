"""Serve, prove the socket, register; re-register when the kubelet restarts; stop cleanly.

NVIDIA's order (server.go Start): reclaim a stale socket, listen, dial our own socket to prove
it, then Register with the kubelet. Then wait for the first of: kubelet.sock re-created (a new
kubelet deletes every plugin socket and serves a new kubelet.sock), one of our sockets gone,
or the stop event (SIGTERM). On a restart signal the servers stop with a short grace, the
sockets are removed, and the loop serves and registers again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpushare import logs
from gpushare.kube.retry import REGISTER, pause
from gpushare.model.request import GpuKind
from gpushare_plugin._proto.v1beta1 import api_pb2, api_pb2_grpc
from gpushare_plugin.server import OPTIONS, DevicePluginServicer

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
SOCKET_NAMES = {
    GpuKind.MEMORY: "volcano-gpu-memory.sock",
    GpuKind.NUMBER: "volcano-gpu-number.sock",
}
_POLL_S = 0.5
_DIAL_TIMEOUT_S = 5.0
_REGISTER_TIMEOUT_S = 10.0
_STOP_GRACE_S = 1.0


class SocketBusy(Exception):
    """Another live process serves our socket path."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Endpoint:
    servicer: DevicePluginServicer
    path: Path


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file `path` is; with its change time, as a new file may get the inode of the one
    removed just before (a kubelet restarting at once; only one re-created within the same
    timestamp tick would still pass for the old). A chmod of it re-registers: harmless."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_ctime_ns


async def reclaim(path: Path) -> None:
    """Remove a socket left by a crashed run; SocketBusy if something still answers on it."""
    try:
        _, writer = await asyncio.open_unix_connection(str(path))
    except FileNotFoundError:
        return
    except ConnectionRefusedError:
        await asyncio.to_thread(path.unlink, missing_ok=True)
        return
    writer.close()
    await writer.wait_closed()
    raise SocketBusy(
        f"{path} is served by another live process (another device plugin for the same "
        f"resources?); stop it first"
    )


class Supervisor:
    def __init__(self, *, socket_dir: Path, servicers: list[DevicePluginServicer]) -> None:
        self._dir = socket_dir
        self._endpoints = [
            _Endpoint(servicer=s, path=socket_dir / SOCKET_NAMES[s.kind]) for s in servicers
        ]
        self._log = logs.get("lifecycle")
        self.registrations = 0
        """How many times both resources have been registered (tests and metrics read it)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and register until `stop` is set; then remove the sockets and return."""
        delays = REGISTER.delays()
        while not stop.is_set():
            servers: list[grpc.aio.Server] = []
            try:
                servers = await self._serve()
                kubelet = await self._register(stop)
                if kubelet is None:
                    continue  # stopping
                delays = REGISTER.delays()
                reason = await self._wait_restart(kubelet, stop)
                if reason:
                    self._log.info("re-registering", reason=reason)
            except (SocketBusy, grpc.aio.AioRpcError, OSError, TimeoutError) as error:
                delay = next(delays)
                self._log.error("serving failed; retrying", error=str(error), retry_s=delay)
                await pause(delay, stop)
            finally:
                await asyncio.gather(*(server.stop(_STOP_GRACE_S) for server in servers))
                for endpoint in self._endpoints:
                    endpoint.path.unlink(missing_ok=True)
        self._log.info("stopped; sockets removed")

    async def _serve(self) -> list[grpc.aio.Server]:
        """One server per socket (a server offers every service on every port it has)."""
        self._dir.mkdir(parents=True, exist_ok=True)
        servers = []
        try:
            for endpoint in self._endpoints:
                await reclaim(endpoint.path)
                # Build the device list now: the kubelet's first ListAndWatch gets it at once.
                await asyncio.to_thread(endpoint.servicer.current)
                server = grpc.aio.server()
                api_pb2_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
                    endpoint.servicer, server
                )
                server.add_insecure_port(f"unix://{endpoint.path}")
                await server.start()
                servers.append(server)
                await self._dial(endpoint.path)
        except BaseException:
            await asyncio.gather(*(server.stop(None) for server in servers))
            raise
        return servers

    @staticmethod
    async def _dial(path: Path) -> None:
        """Prove the socket answers before telling the kubelet about it."""
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=_DIAL_TIMEOUT_S)

    async def _register(self, stop: asyncio.Event) -> tuple[int, int, int] | None:
        """Register every resource once kubelet.sock exists; the kubelet socket's identity,
        or None when stopped first."""
        kubelet_path = self._dir / KUBELET_SOCKET
        waited = False
        while (kubelet := _identity(kubelet_path)) is None:
            if not waited:
                self._log.info("waiting for the kubelet", socket=str(kubelet_path))
                waited = True
            if await pause(_POLL_S, stop):
                return None
        async with grpc.aio.insecure_channel(f"unix://{kubelet_path}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            for endpoint in self._endpoints:
                await stub.Register(
                    api_pb2.RegisterRequest(
                        version=API_VERSION,
                        endpoint=endpoint.path.name,
                        resource_name=endpoint.servicer.kind.value,
                        options=OPTIONS,
                    ),
                    timeout=_REGISTER_TIMEOUT_S,
                )
                self._log.info(
                    "registered with the kubelet",
                    resource=endpoint.servicer.kind.value,
                    socket=str(endpoint.path),
                )
        self.registrations += 1
        return kubelet

    async def _wait_restart(self, kubelet: tuple[int, int, int], stop: asyncio.Event) -> str | None:
        """Why to serve and register again, or None when stopping."""
        kubelet_path = self._dir / KUBELET_SOCKET
        while not stop.is_set():
            if await pause(_POLL_S, stop):
                break
            now = _identity(kubelet_path)
            if now is not None and now != kubelet:
                return "kubelet.sock was re-created (kubelet restart)"
            for endpoint in self._endpoints:
                if not endpoint.path.exists():
                    return f"{endpoint.path.name} was deleted (kubelet restart)"
        return None

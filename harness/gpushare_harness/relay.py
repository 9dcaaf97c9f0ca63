"""A loopback TCP relay between a client and the apiserver (TLS passes through untouched), to
break the network between them as real networks break: `sever` drops every connection and
refuses new ones (a partition), until `heal`; `stall` leaves the connections open now silent
for good in both directions, while new ones pass (a half-open connection after a NAT or
load-balancer lost its state: no reset ever comes, a watch on it just goes quiet)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import yaml


class Relay:
    def __init__(self, upstream: int) -> None:
        """`upstream`: the apiserver's port on loopback."""
        self.upstream = upstream
        self.severed = False
        self._pumps: set[asyncio.Task[None]] = set()
        self._flowing: set[asyncio.Event] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.severed:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:  # the apiserver restarting: the caller sees a reset
            writer.close()
            return
        flowing = asyncio.Event()
        flowing.set()

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    await flowing.wait()  # a stalled connection holds what it read
                    sink.write(data)
                    await sink.drain()

        pumps = {
            asyncio.create_task(pump(reader, up_writer)),
            asyncio.create_task(pump(up_reader, writer)),
        }
        self._pumps |= pumps
        self._flowing.add(flowing)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps -= pumps
            self._flowing.discard(flowing)
            for end in (writer, up_writer):
                end.close()

    def stall(self) -> int:
        """Silence every connection open now; returns how many."""
        stalled = [flowing for flowing in self._flowing if flowing.is_set()]
        for flowing in stalled:
            flowing.clear()
        return len(stalled)

    def sever(self) -> None:
        self.severed = True
        for task in list(self._pumps):
            task.cancel()

    def heal(self) -> None:
        self.severed = False

    async def close(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def through(kubeconfig: Path, port: int) -> Path:
    """The kubeconfig, rewritten to reach the apiserver at `port` on loopback instead."""
    config = yaml.safe_load(kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    config["clusters"][0]["cluster"]["server"] = f"{server.rsplit(':', 1)[0]}:{port}"
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig

"""The API client: no per-request look into the environment unless a proxy is set there;
calls answer with their body, an ApiError, or ApiUnreachable (an OSError)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from gpushare.kube import ApiError, ApiUnreachable, api_client, raw_json

pytestmark = pytest.mark.asyncio

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in ("https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(variable.upper(), raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


async def test_without_a_proxy_in_the_environment_requests_do_not_look_there(
    kubeconfig: Path,
) -> None:
    async with await api_client(kubeconfig) as api:
        assert api.rest_client.pool_manager.trust_env is False
        assert api.configuration.host == "https://127.0.0.1:6443"


async def test_a_proxy_in_the_environment_is_still_used(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    async with await api_client(kubeconfig) as api:
        assert api.rest_client.pool_manager.trust_env is True


async def test_a_connection_cut_before_the_answer_is_an_unanswered_call() -> None:
    """The apiserver restarting mid-request: the caller gets an OSError (ApiUnreachable),
    which every retry loop of gpushare handles, not aiohttp's ServerDisconnectedError."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ApiUnreachable, match="ServerDisconnectedError") as raised:
                await raw_json(session.get(f"http://127.0.0.1:{port}/api/v1/pods"))
        assert isinstance(raised.value, OSError)
    finally:
        server.close()
        await server.wait_closed()


async def test_an_error_status_is_an_api_error_with_the_status_message() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"kind":"Status","message":"pods \\"x\\" not found"}'
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ApiError) as raised:
                await raw_json(session.get(f"http://127.0.0.1:{port}/api/v1/pods/x"))
        assert (raised.value.status, raised.value.message) == (404, 'pods "x" not found')
    finally:
        server.close()
        await server.wait_closed()

"""The operator's Bindings and Events over HTTP/2: which apiserver it trusts and how it says no."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from gpushare import certs
from gpushare.kube import ApiUnreachable
from gpushare.kube.http2 import Http2Writer

VALID = datetime.timedelta(hours=1)
HEADERS, RST_STREAM, SETTINGS, DATA = 1, 3, 4, 0
END_HEADERS, ACK = 4, 1
INTERNAL_ERROR = 2
STATUS_200 = b"\x88"
"""`:status: 200` in HPACK (entry 8 of the static table, indexed)."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return header + payload


class TlsServer:
    """A TLS server on loopback that offers HTTP/2 and HTTP/1.1 and notes what each connection
    chose. `answer`: None hangs up at once; otherwise it speaks HTTP/2 frames (settles in with
    SETTINGS, `max_streams` when given, and its ACK) and answers each request's HEADERS with
    `answer(stream)`: nothing (silent, as a half-open connection), a reset, ...."""

    def __init__(
        self,
        issued: certs.Issued,
        directory: Path,
        *,
        answer: Callable[[int], bytes] | None = None,
        max_streams: int | None = None,
    ) -> None:
        (directory / "server.crt").write_bytes(issued.cert)
        (directory / "server.key").write_bytes(issued.key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(directory / "server.crt", directory / "server.key")
        self.context.set_alpn_protocols(["h2", "http/1.1"])
        self.answer = answer
        self.max_streams = max_streams
        self.chosen: list[str | None] = []
        self.requests = 0
        self.port = 0
        self._open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._open[handler] = writer
        try:
            await self._converse(reader, writer)
        finally:
            writer.close()
            del self._open[handler]

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.chosen.append(writer.get_extra_info("ssl_object").selected_alpn_protocol())
        if self.answer is not None:
            limit = b"" if self.max_streams is None else (3).to_bytes(2, "big")
            limit += b"" if self.max_streams is None else self.max_streams.to_bytes(4, "big")
            writer.write(frame(SETTINGS, 0, 0, limit) + frame(SETTINGS, ACK, 0))
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await reader.readexactly(24)  # the client's preface
                while True:
                    header = await reader.readexactly(9)
                    await reader.readexactly(int.from_bytes(header[:3], "big"))
                    if header[3] == HEADERS:
                        self.requests += 1
                        writer.write(self.answer(int.from_bytes(header[5:9], "big") & 0x7FFFFFFF))

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Listen until the block ends, then end the connections still open."""
        server = await asyncio.start_server(self._connected, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            try:
                yield
            finally:
                # Cut off, each conversation ends of itself (a cancelled one would leave its
                # socket to the GC, and Python 3.11 logs the cancelled handler as an error).
                for writer in self._open.values():
                    writer.transport.abort()
                await asyncio.gather(*self._open, return_exceptions=True)


def silent(_stream: int) -> bytes:
    return b""


def reset(stream: int) -> bytes:
    return frame(RST_STREAM, 0, stream, INTERNAL_ERROR.to_bytes(4, "big"))


def reset_mid_body(stream: int) -> bytes:
    return (
        frame(HEADERS, END_HEADERS, stream, STATUS_200)
        + frame(DATA, 0, stream, b"k8s")
        + reset(stream)
    )


@pytest.fixture
def ca(tmp_path: Path) -> certs.Issued:
    issued = certs.new_ca("cluster-ca", valid=VALID)
    (tmp_path / "ca.crt").write_bytes(issued.cert)
    return issued


@pytest_asyncio.fixture
async def server(ca: certs.Issued, tmp_path: Path) -> AsyncIterator[TlsServer]:
    tls = TlsServer(certs.issue(ca, "apiserver", valid=VALID, hosts=["kubernetes"]), tmp_path)
    async with tls.serving():
        yield tls


@pytest_asyncio.fixture
async def silent_server(ca: certs.Issued, tmp_path: Path) -> AsyncIterator[TlsServer]:
    issued = certs.issue(ca, "apiserver", valid=VALID, hosts=["127.0.0.1"])
    tls = TlsServer(issued, tmp_path, answer=silent)
    async with tls.serving():
        yield tls


def configuration(host: str, ca_file: Path | None = None) -> client.Configuration:
    config = client.Configuration(host=host)
    config.ssl_ca_cert = None if ca_file is None else str(ca_file)
    config.api_key = {"BearerToken": "token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    return config


@pytest.mark.asyncio
async def test_writes_offer_http2_to_the_apiserver_the_kubeconfig_names_by_its_tls_server_name(
    server: TlsServer, tmp_path: Path
) -> None:
    # The certificate names "kubernetes" only: the connection goes to the address and checks
    # the certificate against the tls-server-name, as client-go does.
    config = configuration(f"https://127.0.0.1:{server.port}", tmp_path / "ca.crt")
    config.tls_server_name = "kubernetes"
    async with Http2Writer(config, timeout_s=5, user_agent="test") as writer:
        with pytest.raises(ApiUnreachable):
            await writer.post_protobuf("/api/v1/namespaces/default/pods/p/binding", b"k8s\x00")
    assert server.chosen == ["h2"]


@pytest.mark.asyncio
async def test_an_apiserver_whose_certificate_another_ca_signed_gets_no_write(
    server: TlsServer, tmp_path: Path
) -> None:
    other = certs.new_ca("other-ca", valid=VALID)
    (tmp_path / "other.crt").write_bytes(other.cert)
    config = configuration(f"https://127.0.0.1:{server.port}", tmp_path / "other.crt")
    config.tls_server_name = "kubernetes"
    async with Http2Writer(config, timeout_s=5, user_agent="test") as writer:
        with pytest.raises(ConnectionError, match="certificate"):
            await writer.post_protobuf("/api/v1/namespaces/default/events", b"k8s\x00")
    assert server.chosen == []  # no handshake finished: nothing was sent


@pytest.mark.asyncio
async def test_a_connection_gone_silent_is_given_up_after_a_write_times_out(
    silent_server: TlsServer, tmp_path: Path
) -> None:
    config = configuration(f"https://127.0.0.1:{silent_server.port}", tmp_path / "ca.crt")
    path = "/api/v1/namespaces/default/events"
    async with Http2Writer(config, timeout_s=1, user_agent="test") as writer:
        first = asyncio.create_task(writer.post_protobuf(path, b"k8s\x00"))
        await asyncio.sleep(0.5)
        second = asyncio.create_task(writer.post_protobuf(path, b"k8s\x00"))
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        assert silent_server.chosen == ["h2"]  # both on one connection
        # Each unanswered write is an OSError (a TimeoutError, or cut off with the connection).
        assert all(isinstance(outcome, OSError) for outcome in outcomes), outcomes
        with pytest.raises(TimeoutError):
            await writer.post_protobuf(path, b"k8s\x00")
    assert silent_server.chosen == ["h2", "h2"]  # the next write on a connection of its own


@pytest.mark.asyncio
async def test_a_write_given_its_own_timeout_waits_that_long_not_the_writers(
    silent_server: TlsServer, tmp_path: Path
) -> None:
    # The live bindTimeoutSeconds, raised or lowered after the writer was made.
    config = configuration(f"https://127.0.0.1:{silent_server.port}", tmp_path / "ca.crt")
    path = "/api/v1/namespaces/default/events"
    async with Http2Writer(config, timeout_s=30, user_agent="test") as writer:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await writer.post_protobuf(path, b"k8s\x00", timeout_s=0.5)
        assert time.monotonic() - started < 5


@pytest.mark.asyncio
async def test_the_systems_roots_are_not_trusted_when_the_kubeconfig_names_a_ca(
    tmp_path: Path, ca: certs.Issued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The system's roots hold a CA that signed the server's certificate (as a public CA would
    # sign one for the apiserver's name); the kubeconfig names the cluster's CA only.
    public = certs.new_ca("public-ca", valid=VALID)
    (tmp_path / "public.crt").write_bytes(public.cert)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.crt"))
    tls = TlsServer(certs.issue(public, "apiserver", valid=VALID, hosts=["127.0.0.1"]), tmp_path)
    async with tls.serving():
        config = configuration(f"https://127.0.0.1:{tls.port}", tmp_path / "ca.crt")
        async with Http2Writer(config, timeout_s=5, user_agent="test") as writer:
            with pytest.raises(ConnectionError, match="certificate"):
                await writer.post_protobuf("/api/v1/namespaces/default/events", b"k8s\x00")
        # Without a CA in the kubeconfig, the system's roots are what there is to trust.
        async with Http2Writer(
            configuration(f"https://127.0.0.1:{tls.port}"), timeout_s=5, user_agent="test"
        ) as writer:
            with pytest.raises(ApiUnreachable):
                await writer.post_protobuf("/api/v1/namespaces/default/events", b"k8s\x00")
    assert tls.chosen == ["h2"]  # only the second handshake finished


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", [reset, reset_mid_body], ids=["reset", "reset mid-body"])
async def test_a_request_the_apiserver_cuts_off_is_unreachable_as_every_unanswered_call(
    answer: Callable[[int], bytes], ca: certs.Issued, tmp_path: Path
) -> None:
    # Every caller rides out an unanswered call with one `except OSError`; anything else
    # would end a bind's task (the pod stranded) or the reporter (the operator).
    issued = certs.issue(ca, "apiserver", valid=VALID, hosts=["127.0.0.1"])
    tls = TlsServer(issued, tmp_path, answer=answer)
    async with tls.serving():
        config = configuration(f"https://127.0.0.1:{tls.port}", tmp_path / "ca.crt")
        async with Http2Writer(config, timeout_s=5, user_agent="test") as writer:
            with pytest.raises(ApiUnreachable):
                await writer.post_protobuf("/api/v1/namespaces/default/events", b"k8s\x00")


@pytest.mark.asyncio
async def test_writes_past_the_connections_streams_wait_their_turn_before_their_check(
    ca: certs.Issued, tmp_path: Path
) -> None:
    # A check passed long before the bytes go out would let a paused leader's Binding out
    # late; with the apiserver allowing one stream, one write at a time is checked and sent.
    issued = certs.issue(ca, "apiserver", valid=VALID, hosts=["127.0.0.1"])
    tls = TlsServer(issued, tmp_path, answer=silent, max_streams=1)
    checked: list[int] = []
    async with tls.serving():
        config = configuration(f"https://127.0.0.1:{tls.port}", tmp_path / "ca.crt")
        async with Http2Writer(config, timeout_s=1, user_agent="test", streams=1) as writer:
            path = "/api/v1/namespaces/default/pods/p/binding"
            writes = [
                asyncio.create_task(
                    writer.post_protobuf(
                        path, b"k8s\x00", sending=functools.partial(checked.append, n)
                    )
                )
                for n in range(3)
            ]
            await asyncio.sleep(0.5)
            assert (checked, tls.requests) == ([0], 1)
            outcomes = await asyncio.gather(*writes, return_exceptions=True)
    # Each given up on the silent connection: an OSError, as every unanswered call.
    assert all(isinstance(outcome, OSError) for outcome in outcomes), outcomes
    assert checked == [0, 1, 2]


def test_a_kubeconfig_that_skips_verifying_the_apiserver_is_refused_with_the_fix() -> None:
    config = configuration("https://127.0.0.1:6443")
    config.verify_ssl = False
    with pytest.raises(ValueError, match="certificate-authority"):
        Http2Writer(config, timeout_s=5, user_agent="test")


def test_a_tls_server_name_for_a_server_named_by_dns_is_refused_with_the_fix(
    tmp_path: Path, ca: certs.Issued
) -> None:
    config = configuration("https://api.example:6443", tmp_path / "ca.crt")
    config.tls_server_name = "kubernetes"
    with pytest.raises(ValueError, match="IP address"):
        Http2Writer(config, timeout_s=5, user_agent="test")

"""The operator's writes for every pod it binds (the Binding, the Scheduled Event) over HTTP/2.

kubernetes_asyncio speaks HTTP/1.1 (aiohttp): a connection per call in flight, so the
operator's 512 Bindings in flight held 512 connections (half its memory at 1,000 nodes), each
request its own reads, writes and goroutine wake-ups in the apiserver. kube-scheduler's
client-go multiplexes its calls on HTTP/2 connections. HTTP/2's framing in Python costs more
CPU than it saves, and so does a native client with a Python layer per request (pyqwest);
pyreqwest (reqwest and hyper, in native code up to the answer's bytes) costs the operator
about half of aiohttp's CPU per write (docs/benchmarks.md: the servers' CPU per pod did not
measurably move). These writes go through it on the identity, CA and address of the
ApiClient they are made from. Everything else (watches, reads, patches) stays on the
ApiClient: a watch is one long stream, where HTTP/2 saves nothing.

The connections trust only the cluster's CA when the kubeconfig names one, as client-go's do,
the system's roots only when it names none (`_trusting_only`).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kubernetes_asyncio import client
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import RequestError, RequestTimeoutError
from pyreqwest.proxy import ProxyBuilder

from gpushare.kube import protobuf
from gpushare.kube.errors import ApiUnreachable, api_error

STREAMS = 100
"""Writes in flight at once: kube-apiserver's streams per HTTP/2 connection unless its
--http2-max-streams-per-connection says otherwise. hyper opens no second connection to a host
(client-go's transport does) but queues the rest inside, where a request neither waits for its
`sending` check nor can be called back: so they wait here instead."""


class Http2Writer:
    """POSTs protobuf bodies (gpushare.kube.protobuf) to the apiserver of `configuration` over
    HTTP/2 (ALPN decides; a server without HTTP/2 gets HTTP/1.1). Each call's bearer token is
    read from the configuration, so a projected token that rotates is followed. Raises
    ValueError for a configuration it cannot honour, naming the fix."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        timeout_s: float,
        user_agent: str,
        streams: int = STREAMS,
    ) -> None:
        self._configuration = configuration
        self._base = _address(configuration)
        self._client = _client(configuration, timeout_s=timeout_s, user_agent=user_agent)
        self._streams = asyncio.Semaphore(streams)

    async def post_protobuf(
        self,
        path: str,
        body: bytes,
        *,
        sending: Callable[[], None] = lambda: None,
        timeout_s: float | None = None,
    ) -> bytes:
        """POST `body` to `path`; the answer's protobuf body. ApiError on >= 300 (with the
        Status's message and Retry-After), ApiUnreachable (an OSError) or TimeoutError when
        no answer came: a stream reset, a body cut off, a connection dropped are all
        ApiUnreachable. `sending` is called as the request is handed to the connection, with a
        stream free for it, and may raise to send nothing: no wait lies between but a TLS
        handshake when the connection is new (the first, or one lost). A request handed over
        is sent even if its caller is cancelled meanwhile, as a bind's bytes once written are.
        The path is sent as it is: its names are DNS labels. `timeout_s`: this request's own
        (else the writer's)."""
        request = self._client.post(self._base + path).body_bytes(body)
        if timeout_s is not None:
            request = request.timeout(datetime.timedelta(seconds=timeout_s))
        bearer = (await self._configuration.auth_settings()).get("BearerToken")
        if bearer and bearer.get("value"):
            request = request.header(bearer["key"], bearer["value"], is_sensitive=True)
        async with self._streams:
            sending()
            try:
                answer = await request.build().send()
                content = bytes(await answer.bytes())
            except RequestTimeoutError:
                raise  # a TimeoutError, as the callers expect
            except RequestError as error:
                raise ApiUnreachable(f"{type(error).__name__}: {error}") from error
        if answer.status >= 300:
            retry_after = answer.get_header("Retry-After")
            raise api_error(
                answer.status, {"Retry-After": retry_after} if retry_after else {}, content
            )
        return content

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> Http2Writer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _client(configuration: client.Configuration, *, timeout_s: float, user_agent: str) -> Client:
    if not configuration.verify_ssl:
        raise ValueError(
            "the kubeconfig skips verifying the apiserver's certificate "
            "(insecure-skip-tls-verify), which the operator's HTTP/2 writes do not do: "
            "give the cluster's CA (certificate-authority) instead"
        )
    builder = (
        ClientBuilder()
        .http2(True)
        .user_agent(user_agent)
        .default_headers({"Content-Type": protobuf.MEDIA_TYPE, "Accept": protobuf.MEDIA_TYPE})
        .timeout(datetime.timedelta(seconds=timeout_s))
        .connect_timeout(datetime.timedelta(seconds=min(timeout_s, 30.0)))
        # Writes share a connection, and one gone silent (half-open behind a load balancer
        # that forgot it) would hold them until the kernel gives up, minutes later: a PING
        # unanswered, or bytes unacknowledged, for half a write's timeout closes it (client-go
        # pings too), and the next write opens a new one.
        .http2_keep_alive_interval(datetime.timedelta(seconds=timeout_s / 2))
        .http2_keep_alive_timeout(datetime.timedelta(seconds=timeout_s / 2))
        .tcp_user_timeout(datetime.timedelta(seconds=timeout_s / 2))
        .follow_redirects(False)
    )
    if configuration.ssl_ca_cert:
        builder = builder.add_root_certificate_pem(Path(configuration.ssl_ca_cert).read_bytes())
    if configuration.cert_file and configuration.key_file:
        identity = Path(configuration.cert_file).read_bytes()
        builder = builder.identity_pem(identity + b"\n" + Path(configuration.key_file).read_bytes())
    if configuration.proxy:
        builder = builder.proxy(ProxyBuilder.all(configuration.proxy))
    name = configuration.tls_server_name
    if name:
        url = urlsplit(str(configuration.host))
        builder = builder.resolve(name, _address_of(url.hostname or "", name), url.port or 443)
    if not configuration.ssl_ca_cert:
        return builder.build()
    with _trusting_only(Path(configuration.ssl_ca_cert)):
        return builder.build()


@contextmanager
def _trusting_only(ca_file: Path) -> Iterator[None]:
    """reqwest adds a given CA to the system's roots, which it reads while the client is built,
    from SSL_CERT_FILE and SSL_CERT_DIR when either is set (rustls-native-certs). Pointed at
    the CA alone for that moment, the client trusts the cluster's CA and nothing else, as
    client-go does (tests/unit/kube/test_http2.py holds it to that). Once per writer, made as
    the operator starts, before threads of its own that could read the environment meanwhile;
    the connections it opens later (one lost, one more) keep that verifier."""
    saved = {name: os.environ.get(name) for name in _ROOTS_VARIABLES}
    os.environ["SSL_CERT_FILE"] = str(ca_file)
    os.environ["SSL_CERT_DIR"] = str(ca_file.parent / "no-system-roots")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_ROOTS_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def _address(configuration: client.Configuration) -> str:
    """The apiserver's URL, its host the tls-server-name when the kubeconfig gives one (the
    connection then goes to the configured address: `ClientBuilder.resolve`)."""
    url = urlsplit(str(configuration.host).rstrip("/"))
    name = configuration.tls_server_name
    if not name:
        return urlunsplit(url)
    port = f":{url.port}" if url.port else ""
    return urlunsplit(url._replace(netloc=f"{name}{port}"))


def _address_of(host: str, name: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(
            f"the kubeconfig's tls-server-name {name!r} goes with a server named {host!r}; "
            "the operator's HTTP/2 writes need the server's IP address there (or no "
            "tls-server-name, the certificate naming the server)"
        ) from None

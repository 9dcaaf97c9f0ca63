"""The thin layer under every Kubernetes call of gpushare: client set-up and raw responses.

kubernetes_asyncio deserialises responses into its generated models, which cost CPU on large
lists; gpushare reads the raw JSON instead. But a raw response (`_preload_content=False`) is
not checked by the client at all, so `raw_json` checks the status itself and raises
`ApiError`. (The Binding and the Event of every pod bound go over HTTP/2: `http2`.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client, config

from gpushare.kube.errors import ApiError, ApiUnreachable, api_error


async def raw_json(call: Awaitable[object]) -> dict[str, Any]:
    """The JSON body of a call made with `_preload_content=False`; ApiError on >= 300,
    ApiUnreachable (an OSError) when no answer came."""
    body = await _answer(call)
    decoded = json.loads(body) if body else {}
    return decoded if isinstance(decoded, dict) else {}


async def _answer(call: Awaitable[object]) -> bytes:
    """The body of a call made with `_preload_content=False`, checked: ApiError on >= 300
    (with the message of the Status the apiserver sent, JSON or protobuf), ApiUnreachable
    when no answer came."""
    try:
        response = cast(aiohttp.ClientResponse, await call)
        async with response:
            body = await response.read()
    except aiohttp.ClientError as error:
        if isinstance(error, OSError):
            raise
        # ServerDisconnectedError, ClientPayloadError ...: not OSErrors, but no answer either.
        raise ApiUnreachable(f"{type(error).__name__}: {error}") from error
    if response.status >= 300:
        raise api_error(response.status, response.headers, body)
    return body


async def read_pod(
    core: client.CoreV1Api, name: str, namespace: str, uid: str, *, timeout_s: float
) -> dict[str, Any] | None:
    """The pod as the apiserver has it now; None when it is gone or replaced by a namesake
    (another uid is another pod)."""
    try:
        body = await raw_json(
            core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=timeout_s
            )
        )
    except ApiError as error:
        if error.status == 404:
            return None
        raise
    return body if body.get("metadata", {}).get("uid") == uid else None


async def api_client(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    connections: int = 100,
    user_agent: str | None = None,
) -> client.ApiClient:
    """An ApiClient for `kubeconfig` (its `context`, else its current one), else the in-cluster
    service account, else the default kubeconfig ($KUBECONFIG, ~/.kube/config), with at most
    `connections` open at once (each holds one call: HTTP/1.1). `user_agent` names the
    component to the apiserver: its audit log, and the manager of the fields it writes
    (`managedFields`). The caller closes it (`async with`)."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = connections
    if kubeconfig is not None or context is not None:
        await config.load_kube_config(
            config_file=None if kubeconfig is None else str(kubeconfig),
            context=context,
            client_configuration=configuration,
        )
    else:
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]  # untyped upstream
                client_configuration=configuration
            )
        except config.ConfigException:
            await config.load_kube_config(client_configuration=configuration)
    api = client.ApiClient(configuration)
    if user_agent is not None:
        api.user_agent = user_agent
    if not _proxy_in_environment():
        _without_environment_lookups(api)
    return api


_PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy")


def _proxy_in_environment() -> bool:
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES)


def _without_environment_lookups(api: client.ApiClient) -> None:
    """The client's aiohttp session trusts the environment, so every request looks up the
    proxy variables and reads ~/.netrc in a worker thread: a fifth of the operator's
    per-request time in a burst. Without a proxy in the environment there is nothing to find:
    the same connection pool goes on in a session that does not look (a kubeconfig's
    proxy-url is passed per request, and still applies)."""
    rest = api.rest_client
    connector = rest.pool_manager.connector
    rest.pool_manager.detach()
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=_READ_BUFFER_BYTES
    )


_READ_BUFFER_BYTES = 2**21
"""As the client library sets it: a watch event may carry an object near etcd's 1.5 MiB."""

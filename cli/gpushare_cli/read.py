"""What the CLI reads: the cluster in one pass (nodes, pods, GPUNodes and the live
GPUShareConfig), and a Pod manifest for `simulate`.

Each kind is listed in pages (`gpushare.kube.reflector.list_pages`, as the operator lists
it), and each read is tried again for a few seconds while the apiserver asks to wait
(`gpushare.kube.retry`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts

from gpushare import kube
from gpushare.kube import ApiError
from gpushare.kube.clock import parse_time
from gpushare.kube.reflector import Item, ListCall, WatchExpired, list_pages
from gpushare.kube.retry import READ, retry, transient
from gpushare.model import contract
from gpushare.model.bodies import Body, path
from gpushare.model.gangs import PLURAL, GroupApi
from gpushare_cli.errors import CliError
from gpushare_operator.config import ConfigError, OperatorConfig, load, with_live

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    nodes: list[Item]
    gpunodes: list[Item]
    pods: list[Item]
    config: OperatorConfig
    """What the operator decides with: as its leader publishes it on its Lease; when no
    operator leads, this process's environment with the live GPUShareConfig applied when it
    is valid."""
    leader: str | None = None
    """The identity of the operator replica that leads now; None when none does."""
    converts: bool = True
    """The admission webhook is installed (its MutatingWebhookConfiguration exists): new
    pods' gpu-memory limits are converted to the cluster's unit."""
    podgroups: list[tuple[GroupApi, Item]] = field(default_factory=list)
    """Volcano's and the coscheduling PodGroups (where their CRDs are installed)."""
    budgets: list[Item] = field(default_factory=list)
    """The PodDisruptionBudgets (empty where this user may not list them all)."""


def context_namespace(kubeconfig: Path | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context (`context`, else the current one), as
    kubectl takes it; "default" when it names none, or there is no kubeconfig."""
    try:
        contexts, current = list_kube_config_contexts(
            None if kubeconfig is None else str(kubeconfig)
        )
    except (ConfigException, OSError):
        return "default"
    wanted = (
        current
        if context is None
        else next((c for c in contexts if c.get("name") == context), None)
    )
    if context is not None and wanted is None:
        names = ", ".join(sorted(str(c.get("name")) for c in contexts))
        raise CliError(f"context {context!r} is not in the kubeconfig (it has: {names})", status=2)
    found = ((wanted or {}).get("context") or {}).get("namespace")
    return str(found) if found else "default"


async def read_cluster(kubeconfig: Path | None, context: str | None = None) -> Cluster:
    try:
        async with await kube.api_client(kubeconfig, context=context) as api:
            core = client.CoreV1Api(api)
            objects = client.CustomObjectsApi(api)
            nodes = await list_all(core.list_node)
            pods = await list_all(core.list_pod_for_all_namespaces)
            gpunodes = await list_all(
                functools.partial(
                    objects.list_cluster_custom_object,
                    contract.INVENTORY_GROUP,
                    contract.INVENTORY_VERSION,
                    contract.INVENTORY_PLURAL,
                ),
                optional=True,
            )
            podgroups = await _podgroups(objects)
            budgets = await _budgets(client.PolicyV1Api(api))
            live: Item = await _read(
                lambda: kube.raw_json(
                    objects.get_cluster_custom_object(
                        contract.CONFIG_GROUP,
                        contract.CONFIG_VERSION,
                        contract.CONFIG_PLURAL,
                        contract.LIVE_CONFIG_NAME,
                        _preload_content=False,
                    )
                ),
                absent={},
            )
            assumed = live_config(live)
            webhook = await _webhook_installed(api, assumed.webhook_configuration)
            leading = await _leading_operator(api, assumed)
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise CliError(
            f"cannot reach the cluster ({error}); check KUBECONFIG or --kubeconfig"
        ) from error
    except ConfigException as error:
        raise CliError(f"no usable kubeconfig ({error}); set KUBECONFIG or --kubeconfig") from error
    except ApiError as error:
        raise CliError(f"the cluster refused to list nodes and pods: {error}") from error
    leader, config = leading if leading is not None else (None, assumed)
    return Cluster(
        nodes=nodes,
        gpunodes=gpunodes,
        pods=pods,
        config=config,
        leader=leader,
        converts=webhook,
        podgroups=podgroups,
        budgets=budgets,
    )


LEASE_SLACK_S = 5.0
"""Clock skew allowed between this machine and the operator's when reading its Lease."""


async def _leading_operator(
    api: client.ApiClient, assumed: OperatorConfig
) -> tuple[str, OperatorConfig] | None:
    """The leading operator's identity and the configuration it publishes on its Lease;
    None when no one holds the Lease, it ran out, or it cannot be read (no RBAC to read it,
    an operator too old to publish)."""
    try:
        lease = await _read(
            lambda: kube.raw_json(
                client.CoordinationV1Api(api).read_namespaced_lease(
                    assumed.lease_name, assumed.lease_namespace, _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status in (403, 404):
            return None
        raise
    spec = path(lease, "spec")
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if not holder or renewed is None or not isinstance(duration, int):
        return None
    if renewed + duration + LEASE_SLACK_S < time.time():
        return None
    published = (path(lease, "metadata").get("annotations") or {}).get(contract.EFFECTIVE_CONFIG)
    try:
        decoded = json.loads(str(published))
        if isinstance(decoded, dict):
            return str(holder), with_live(OperatorConfig(), decoded)
    except (ValueError, ConfigError):
        pass
    return None


async def _webhook_installed(api: client.ApiClient, name: str) -> bool:
    """Whether the admission webhook's configuration exists; a user who may not read it is
    told what an installed webhook would do."""
    try:
        await _read(
            lambda: kube.raw_json(
                client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                    name, _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status == 404:
            return False
        if error.status == 403:
            return True
        raise
    return True


async def _podgroups(objects: client.CustomObjectsApi) -> list[tuple[GroupApi, Item]]:
    """Every PodGroup of both APIs; none of an API whose CRD is absent or that the user may
    not list (gangs are then explained as single pods, and `explain` says so)."""
    found = []
    for api in GroupApi:
        call = functools.partial(objects.list_cluster_custom_object, api.group, api.version, PLURAL)
        try:
            found += [(api, item) for item in await list_all(call, optional=True)]
        except ApiError as error:
            if error.status != 403:
                raise
    return found


async def _budgets(policy: client.PolicyV1Api) -> list[Item]:
    """Every PodDisruptionBudget; none when this user may not list them cluster-wide (what
    preemption would evict is then shown as if no budget protected a pod)."""
    try:
        return await list_all(policy.list_pod_disruption_budget_for_all_namespaces)
    except ApiError as error:
        if error.status == 403:
            return []
        raise


async def list_all(call: ListCall, *, optional: bool = False) -> list[Item]:
    """Every object `call` lists, page by page; with `optional`, a 404 (the CRD is not
    installed) lists as empty."""

    async def listing() -> list[Item]:
        items: list[Item] = []
        async for page, _version in list_pages(call):
            items.extend(page)
        return items

    return await _read(listing, absent=[] if optional else None)


async def _read(read: Callable[[], Awaitable[_T]], *, absent: _T | None = None) -> _T:
    """`read()`, tried again for a few seconds while the apiserver asks to wait (429, 503)
    and from the first page when a LIST's continue token expired (410); `absent`, when
    given, is what a 404 reads as (no CRDs, no live config)."""
    try:
        return await retry(read, READ, retryable=_busy)
    except WatchExpired as expired:
        raise ApiError(410, str(expired)) from expired
    except ApiError as error:
        if absent is not None and error.status == 404:
            return absent
        raise


def _busy(error: Exception) -> bool:
    """The apiserver answered but asks to wait (429, 5xx), or a LIST is to start over; a
    cluster that does not answer at all is said at once."""
    return isinstance(error, WatchExpired) or (isinstance(error, ApiError) and transient(error))


def live_config(live: Body) -> OperatorConfig:
    """What the operator decides with: its environment, with the live spec applied."""
    config = load({}, os.environ)
    spec = path(live, "spec")
    if spec:
        # The operator refuses an invalid one too, and keeps its environment's values.
        with contextlib.suppress(ConfigError):
            config = with_live(config, spec)
    return config


def load_pod(file: str, namespace: str) -> dict[str, Any]:
    """The Pod manifest in `file` (- for stdin) as the scheduler would first see it:
    pending, in its namespace (else `namespace`), with a uid, on no node."""
    try:
        text_in = sys.stdin.read() if file == "-" else Path(file).read_text()
        body = yaml.safe_load(text_in)
    except OSError as error:
        raise CliError(f"cannot read {file}: {error}", status=2) from error
    except yaml.YAMLError as error:
        raise CliError(f"{file} is not valid YAML: {error}", status=2) from error
    if not isinstance(body, dict) or body.get("kind") != "Pod":
        raise CliError(f"{file} must hold one Pod manifest (kind: Pod)", status=2)
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise CliError(f"{file}: metadata must be a mapping", status=2)
    meta.setdefault("namespace", namespace)
    meta.setdefault("uid", f"simulated-{uuid.uuid4()}")
    body.setdefault("status", {"phase": "Pending"})
    spec = body.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise CliError(f"{file}: spec.containers is missing", status=2)
    spec.pop("nodeName", None)
    return body

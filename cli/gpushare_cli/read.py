"""What the CLI reads: the cluster in one pass (nodes, pods, GPUNodes and the live
GPUShareConfig), and a Pod manifest for `simulate`.

Each kind is listed in pages (`gpushare.kube.reflector.list_pages`, as the operator lists
it), and each read is tried again for a few seconds while the apiserver asks to wait
(`gpushare.kube.retry`).

A user who may not read everything gets what they may, and a line for each thing they could
not see (`Cluster.unseen`): with rights in one namespace only, that namespace's pods, and the
rest from the GPUNodes (`partial`); no node filter is checked where Nodes cannot be read.
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
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube import ApiError
from gpushare.kube.clock import parse_time
from gpushare.kube.reflector import Item, ListCall, WatchExpired, list_pages
from gpushare.kube.retry import READ, retry, transient
from gpushare.model import contract
from gpushare.model.bodies import Body, path, sequence, text
from gpushare.model.gangs import PLURAL, GroupApi
from gpushare_cli.errors import CliError
from gpushare_cli.kubeconfig import Source, connect
from gpushare_cli.partial import stand_in_nodes, stand_in_pods
from gpushare_operator.config import ConfigError, OperatorConfig, load, with_live

FORBIDDEN = 403

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
    unseen: tuple[str, ...] = ()
    """What this user may not read, and what was done instead: one line each."""
    nodes_checked: bool = True
    """The Nodes were read: their readiness, taints, labels and resources are checked. When
    False, `nodes` are stand-ins made from the GPUNodes (`partial.stand_in_nodes`)."""
    sees_cards: bool = True
    """Nodes or GPUNodes could be read (there may be none): the cards are known."""
    lease_readable: bool = True
    """The operator's Lease could be read (so `leader` None means no operator leads)."""


async def read_cluster(
    source: Source, namespace: str, operator_namespace: str | None = None
) -> Cluster:
    """Everything the CLI decides with; `namespace` is the one whose pods are read when this
    user may not list every namespace's, `operator_namespace` where the operator's Lease is
    (None: found, `_lease_namespace`)."""
    try:
        async with await connect(source) as api:
            return await _read_cluster(api, namespace, operator_namespace)
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise CliError(
            f"cannot reach the cluster of {source.describe()} ({error}); check --kubeconfig, "
            f"KUBECONFIG or --context"
        ) from error
    except ApiError as error:
        raise CliError(f"the cluster refused to list nodes and pods: {error}") from error


async def _read_cluster(
    api: client.ApiClient, namespace: str, operator_namespace: str | None
) -> Cluster:
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    nodes = await _unless_forbidden(list_all(core.list_node))
    pods, every_pod = await _pods(core, namespace)
    gpunodes = await _unless_forbidden(
        list_all(
            functools.partial(
                objects.list_cluster_custom_object,
                contract.INVENTORY_GROUP,
                contract.INVENTORY_VERSION,
                contract.INVENTORY_PLURAL,
            ),
            optional=True,
        )
    )
    podgroups = await _podgroups(objects)
    budgets = await _budgets(client.PolicyV1Api(api))
    no_config: Item = {}
    live = await _unless_forbidden(
        _read(
            lambda: kube.raw_json(
                objects.get_cluster_custom_object(
                    contract.CONFIG_GROUP,
                    contract.CONFIG_VERSION,
                    contract.CONFIG_PLURAL,
                    contract.LIVE_CONFIG_NAME,
                    _preload_content=False,
                )
            ),
            absent=no_config,
        )
    )
    assumed = live_config(live or no_config)
    webhook, webhook_namespace = await _webhook(api, assumed.webhook_configuration)
    lease_namespace = operator_namespace or await _lease_namespace(
        api, assumed.lease_name, webhook_namespace
    )
    leading = await _leading_operator(api, assumed, lease_namespace)
    leader, config = leading if isinstance(leading, tuple) else (None, assumed)
    unseen = []
    if leading is LeaseSeen.FORBIDDEN:
        lease = f"{lease_namespace}/{assumed.lease_name}"
        unseen.append(f"the operator's Lease {lease} is not visible to you: {_decided_with(live)}")
    shown_pods = pods
    shown_nodes = nodes if nodes is not None else stand_in_nodes(gpunodes or [])
    if nodes is None:
        unseen.append(
            "nodes are not visible to you: the cards are read from the GPUNodes, and the "
            "nodes' readiness, taints, labels and CPU/memory are not checked"
            if gpunodes
            else "nodes are not visible to you"
        )
    if gpunodes is None:
        unseen.append(
            "GPUNodes are not visible to you: "
            + (
                "the cards are read from the nodes' capacity (no models, sizes as the device "
                "plugin counts them)"
                if nodes
                else "the cards cannot be known"
            )
            + "; ask for read access to gpunodes.gpushare.io (cluster-wide)"
        )
    if not every_pod:
        others = f"pods of namespaces other than {namespace} are not visible to you"
        if gpunodes:
            served = min(config.scheduler_names, default="")
            shown_pods = pods + stand_in_pods(gpunodes, pods, served)
            unseen.append(
                f"{others}: the cards' use is taken from the GPUNodes' status (and only "
                f"{namespace}'s pods are weighed for preemption)"
            )
        else:
            unseen.append(f"{others}: their use of the cards is not counted")
    return Cluster(
        nodes=shown_nodes,
        gpunodes=gpunodes or [],
        pods=shown_pods,
        config=config,
        leader=leader,
        converts=webhook,
        podgroups=podgroups,
        budgets=budgets,
        unseen=tuple(unseen),
        nodes_checked=nodes is not None,
        sees_cards=nodes is not None or gpunodes is not None,
        lease_readable=leading is not LeaseSeen.FORBIDDEN,
    )


async def _pods(core: client.CoreV1Api, namespace: str) -> tuple[list[Item], bool]:
    """Every namespace's pods (True), or, where this user may not list them all, those of
    `namespace` (False)."""
    every = await _unless_forbidden(list_all(core.list_pod_for_all_namespaces))
    if every is not None:
        return every, True
    try:
        return await list_all(functools.partial(core.list_namespaced_pod, namespace)), False
    except ApiError as error:
        if error.status != FORBIDDEN:
            raise
        raise CliError(
            f"you may not list pods in namespace {namespace} ({error.message}); name your "
            f"namespace with -n"
        ) from error


def _decided_with(live: Item | None) -> str:
    """What a decision made without the operator's Lease used."""
    if live is None:
        return (
            "decided with this shell's GPUSHARE_* environment (the live GPUShareConfig is not "
            "visible to you either)"
        )
    if live:
        return "decided with the live GPUShareConfig and this shell's GPUSHARE_* environment"
    return "decided with this shell's GPUSHARE_* environment (there is no live GPUShareConfig)"


async def _unless_forbidden(read: Awaitable[_T]) -> _T | None:
    """What `read` reads; None when this user may not (403)."""
    try:
        return await read
    except ApiError as error:
        if error.status == FORBIDDEN:
            return None
        raise


LEASE_SLACK_S = 5.0
"""Clock skew allowed between this machine and the operator's when reading its Lease."""


class LeaseSeen(Enum):
    """Why no leader is known."""

    NOT_HELD = "no one holds the Lease, it ran out, or its holder publishes no configuration"
    FORBIDDEN = "this user may not read the Lease"


async def _leading_operator(
    api: client.ApiClient, assumed: OperatorConfig, namespace: str
) -> tuple[str, OperatorConfig] | LeaseSeen:
    """The leading operator's identity and the configuration it publishes on its Lease
    (in `namespace`); else why not."""
    try:
        lease = await _read(
            lambda: kube.raw_json(
                client.CoordinationV1Api(api).read_namespaced_lease(
                    assumed.lease_name, namespace, _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status == FORBIDDEN:
            return LeaseSeen.FORBIDDEN
        if error.status == 404:
            return LeaseSeen.NOT_HELD
        raise
    spec = path(lease, "spec")
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if not holder or renewed is None or not isinstance(duration, int):
        return LeaseSeen.NOT_HELD
    if renewed + duration + LEASE_SLACK_S < time.time():
        return LeaseSeen.NOT_HELD
    published = (path(lease, "metadata").get("annotations") or {}).get(contract.EFFECTIVE_CONFIG)
    try:
        decoded = json.loads(str(published))
        if isinstance(decoded, dict):
            return str(holder), with_live(OperatorConfig(), decoded)
    except (ValueError, ConfigError):
        pass
    return LeaseSeen.NOT_HELD


LEASE_NAMESPACE_ENV = "GPUSHARE_LEASE_NAMESPACE"


async def _lease_namespace(api: client.ApiClient, name: str, hint: str | None) -> str:
    """Where the operator's Lease is: this shell's GPUSHARE_LEASE_NAMESPACE (the operator's
    own variable) when set; else the namespace of the Lease of that name (the one renewed
    last, where this user may list Leases everywhere); else `hint` (the namespace of the
    admission webhook's Service: the operator's); else the operator's default."""
    if given := os.environ.get(LEASE_NAMESPACE_ENV):
        return given
    try:
        listed = await _read(
            lambda: kube.raw_json(
                client.CoordinationV1Api(api).list_lease_for_all_namespaces(
                    field_selector=f"metadata.name={name}", _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status not in (FORBIDDEN, 404):
            raise
        listed = {}
    found = sorted(
        (str(path(lease, "spec").get("renewTime") or ""), str(meta.get("namespace")))
        for lease in listed.get("items") or ()
        if isinstance(lease, dict) and (meta := path(lease, "metadata")).get("namespace")
    )
    if found:
        return found[-1][1]
    return hint or OperatorConfig().lease_namespace


async def _webhook(api: client.ApiClient, name: str) -> tuple[bool, str | None]:
    """Whether the admission webhook's configuration exists (a user who may not read it is
    told what an installed webhook would do), and the namespace of its Service."""
    try:
        found = await _read(
            lambda: kube.raw_json(
                client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                    name, _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status == 404:
            return False, None
        if error.status == FORBIDDEN:
            return True, None
        raise
    for hook in sequence(found.get("webhooks")):
        namespace = text(path(hook, "clientConfig", "service").get("namespace"))
        if namespace:
            return True, namespace
    return True, None


async def _podgroups(objects: client.CustomObjectsApi) -> list[tuple[GroupApi, Item]]:
    """Every PodGroup of both APIs; none of an API whose CRD is absent or that the user may
    not list (gangs are then explained as single pods, and `explain` says so)."""
    found = []
    for api in GroupApi:
        call = functools.partial(objects.list_cluster_custom_object, api.group, api.version, PLURAL)
        try:
            found += [(api, item) for item in await list_all(call, optional=True)]
        except ApiError as error:
            if error.status != FORBIDDEN:
                raise
    return found


async def _budgets(policy: client.PolicyV1Api) -> list[Item]:
    """Every PodDisruptionBudget; none when this user may not list them cluster-wide (what
    preemption would evict is then shown as if no budget covered a pod)."""
    try:
        return await list_all(policy.list_pod_disruption_budget_for_all_namespaces)
    except ApiError as error:
        if error.status == FORBIDDEN:
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

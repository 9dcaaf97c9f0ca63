"""What the CLI reads: the cluster in one pass (nodes, pods, GPUNodes and the live
GPUShareConfig), and a Pod manifest for `simulate`.

Each kind is listed in pages (`gpushare.kube.reflector.list_pages`, as the operator lists
it), and each read is tried again for a few seconds while the apiserver asks to wait
(`gpushare.kube.retry`).

A user who may not read everything gets what they may, and a line for each thing they could
not see (`Cluster.unseen`): with rights in one namespace only, that namespace's pods,
PodGroups and PodDisruptionBudgets, and the rest from the GPUNodes (`partial`); no node
filter is checked where Nodes cannot be read.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
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
from gpushare.model.bodies import Body, annotations_of, path, sequence, text
from gpushare.model.gangs import PLURAL, GroupApi
from gpushare.model.volumes import pod_volumes
from gpushare_cli.errors import CliError, yaml_problem
from gpushare_cli.kubeconfig import Source, connect
from gpushare_cli.partial import stand_in_nodes, stand_in_pods
from gpushare_operator.config import OPTIONS, ConfigError, OperatorConfig, load, with_live

FORBIDDEN = 403

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class VolumeLists:
    claims: list[Item]
    """Every namespace's, or where this user may list neither every namespace's claims nor
    every namespace's pods, those of its namespace (all the pods it is shown are there)."""
    volumes: list[Item]
    classes: list[Item]


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
    volumes: VolumeLists | None = None
    """The claims, volumes and storage classes; None where this user may not read them all
    (pods' claims are then not checked)."""
    unseen: tuple[str, ...] = ()
    """What this user may not read, and what was done instead: one line each."""
    nodes_checked: bool = True
    """The Nodes were read: their readiness, taints, labels and resources are checked. When
    False, `nodes` are stand-ins made from the GPUNodes (`partial.stand_in_nodes`)."""
    sees_cards: bool = True
    """Nodes or GPUNodes could be read (there may be none): the cards are known."""
    leader_known: bool = True
    """Whether an operator leads is known (so `leader` None means none does): its Lease was
    found and read."""


async def read_cluster(
    source: Source, namespace: str, operator_namespace: str | None = None
) -> Cluster:
    """Everything the CLI decides with; `namespace` is the one whose pods are read when this
    user may not list every namespace's, `operator_namespace` where the operator's Lease is
    (None: found, `_lease_namespace`)."""
    shell = shell_config(os.environ)  # a bad variable is said before any call
    try:
        async with await connect(source) as api:
            return await _read_cluster(api, shell, namespace, operator_namespace)
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise CliError(
            f"cannot reach the cluster of {source.describe()} ({error}); check --kubeconfig, "
            f"KUBECONFIG or --context"
        ) from error
    except ApiError as error:
        raise CliError(f"the cluster refused to list nodes and pods: {error}") from error


async def _read_cluster(
    api: client.ApiClient, shell: OperatorConfig, namespace: str, operator_namespace: str | None
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
    podgroups, podgroups_unseen = await _podgroups(objects, namespace)
    budgets, budgets_unseen = await _budgets(client.PolicyV1Api(api), namespace)
    volumes = await _volumes(core, client.StorageV1Api(api), namespace, every_pod)
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
    assumed = live_config(shell, live or no_config)
    webhook, webhook_namespace = await _webhook(api, assumed.webhook_configuration)
    where = await _lease_namespace(api, assumed.lease_name, operator_namespace, webhook_namespace)
    leading = None if where is None else await _leading_operator(api, assumed.lease_name, where)
    leader, config = (
        (leading.identity, leading.config) if isinstance(leading, Leader) else (None, assumed)
    )
    unseen = []
    if isinstance(leading, LeaseUnknown):
        fix = f"; {leading.fix}" if leading.fix else ""
        unseen.append(f"{leading.why}: {_decided_with(live)}{fix}")
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
    unseen += podgroups_unseen
    if budgets_unseen is not None:
        unseen.append(budgets_unseen)
    if volumes is None and any(pod_volumes(pod) is not None for pod in pods):
        unseen.append(
            "PersistentVolumeClaims, PersistentVolumes or StorageClasses are not visible to "
            "you: pods' claims are not checked (the operator checks them)"
        )
    return Cluster(
        nodes=shown_nodes,
        gpunodes=gpunodes or [],
        pods=shown_pods,
        config=config,
        leader=leader,
        converts=webhook,
        podgroups=podgroups,
        budgets=budgets,
        volumes=volumes,
        unseen=tuple(unseen),
        nodes_checked=nodes is not None,
        sees_cards=nodes is not None or gpunodes is not None,
        leader_known=not isinstance(leading, LeaseUnknown),
    )


async def _pods(core: client.CoreV1Api, namespace: str) -> tuple[list[Item], bool]:
    """Every namespace's pods (True), or, where this user may not list them all, those of
    `namespace` (False)."""
    try:
        return await _everywhere_or_in(
            core.list_pod_for_all_namespaces,
            functools.partial(core.list_namespaced_pod, namespace),
        )
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


async def _everywhere_or_in(
    everywhere: ListCall, namespaced: ListCall, *, optional: bool = False
) -> tuple[list[Item], bool]:
    """What `everywhere` lists (True), or, where this user may not list every namespace's,
    what `namespaced` lists in theirs (False); ApiError (403) when they may not list that
    either. With `optional`, a 404 (the CRD is not installed) lists as empty."""
    listed = await _unless_forbidden(list_all(everywhere, optional=optional))
    if listed is not None:
        return listed, True
    return await list_all(namespaced, optional=optional), False


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


@dataclass(frozen=True, slots=True)
class LeaseNamespace:
    """Where the operator's Lease is looked for."""

    name: str
    how: str
    """How it was chosen: said when the Lease is not there."""
    named: bool = False
    """Named by the user (a flag, this shell): no other namespace to suggest."""


@dataclass(frozen=True, slots=True)
class Leader:
    """The operator replica that leads now, and the configuration it publishes."""

    identity: str
    config: OperatorConfig


@dataclass(frozen=True, slots=True)
class LeaseUnknown:
    """Whether an operator leads, or how it decides, cannot be read from its Lease."""

    why: str
    fix: str | None = None


async def _leading_operator(
    api: client.ApiClient, name: str, namespace: LeaseNamespace
) -> Leader | LeaseUnknown | None:
    """The leading operator, read from its Lease `name` in `namespace`; None when no
    operator leads (no one holds the Lease, or it ran out); else why that is not known."""
    lease_name = f"{namespace.name}/{name}"
    try:
        lease = await _read(
            lambda: kube.raw_json(
                client.CoordinationV1Api(api).read_namespaced_lease(
                    name, namespace.name, _preload_content=False
                )
            )
        )
    except ApiError as error:
        if error.status == FORBIDDEN:
            return LeaseUnknown(f"the operator's Lease {lease_name} is not visible to you")
        if error.status == 404:  # an operator makes it when it first leads: not here, then
            return LeaseUnknown(
                f"the operator's Lease {lease_name} was not found in {namespace.name} "
                f"({namespace.how})",
                _ANOTHER_LEASE
                if namespace.named
                else "if the operator runs in another namespace, name it with "
                f"--operator-namespace; {_ANOTHER_LEASE}",
            )
        raise
    spec = path(lease, "spec")
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if not holder or renewed is None or not isinstance(duration, int):
        return None
    if renewed + duration + LEASE_SLACK_S < time.time():
        return None
    published = annotations_of(lease).get(contract.EFFECTIVE_CONFIG)
    problem = f"no {contract.EFFECTIVE_CONFIG} annotation"
    if published is not None:
        try:
            decoded = json.loads(published)
            if isinstance(decoded, dict):
                return Leader(str(holder), with_live(OperatorConfig(), decoded))
            problem = "not a JSON object"
        except ValueError as error:  # ConfigError too: a key or value of a later release
            problem = str(error)
    return LeaseUnknown(
        f"the operator's Lease {lease_name} is held by {holder}, whose configuration this "
        f"gpushare cannot read ({problem})",
        "a gpushare CLI of the operator's version reads it",
    )


LEASE_NAMESPACE_ENV = "GPUSHARE_LEASE_NAMESPACE"
_ANOTHER_LEASE = (
    "if the operator names its Lease otherwise (GPUSHARE_LEASE_NAME), set that in this shell "
    "too; an operator that does not elect a leader publishes no Lease"
)


async def _lease_namespace(
    api: client.ApiClient, name: str, given: str | None, hint: str | None
) -> LeaseNamespace | None:
    """Where the operator's Lease is: `given` (--operator-namespace); else this shell's
    GPUSHARE_LEASE_NAMESPACE (the operator's own variable); else the namespace of the Lease
    of that name (the one renewed last, where this user may list Leases everywhere; None
    when there is none); else `hint` (the namespace of the admission webhook's Service: the
    operator's); else the operator's default."""
    if given:
        return LeaseNamespace(given, "named with --operator-namespace", named=True)
    if from_shell := os.environ.get(LEASE_NAMESPACE_ENV):
        return LeaseNamespace(from_shell, f"named by ${LEASE_NAMESPACE_ENV}", named=True)
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
    else:
        found = sorted(
            (str(path(lease, "spec").get("renewTime") or ""), str(meta.get("namespace")))
            for lease in sequence(listed.get("items"))
            if (meta := path(lease, "metadata")).get("namespace")
        )
        return LeaseNamespace(found[-1][1], "where it was listed") if found else None
    if hint:
        return LeaseNamespace(hint, "the admission webhook's namespace")
    return LeaseNamespace(
        OperatorConfig().lease_namespace,
        "the default: where the operator runs could be read neither from the Leases of every "
        "namespace nor from the admission webhook",
    )


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


async def _podgroups(
    objects: client.CustomObjectsApi, namespace: str
) -> tuple[list[tuple[GroupApi, Item]], list[str]]:
    """The PodGroups of both APIs: every namespace's, or, where this user may not list
    them all, those of `namespace`; and a line for each API whose PodGroups are not all
    visible. None of an API whose CRD is absent."""
    found = []
    unseen = []
    for api in GroupApi:
        try:
            listed, everywhere = await _everywhere_or_in(
                functools.partial(
                    objects.list_cluster_custom_object, api.group, api.version, PLURAL
                ),
                functools.partial(
                    objects.list_namespaced_custom_object, api.group, api.version, namespace, PLURAL
                ),
                optional=True,
            )
        except ApiError as error:
            if error.status != FORBIDDEN:
                raise
            listed, everywhere = None, False
        # RBAC refuses an API the cluster does not serve as it refuses one it does.
        if not everywhere and await _served(objects, api):
            unseen.append(
                f"PodGroups ({api.group}) of namespaces other than {namespace} are not "
                "visible to you: the pods of gangs there are taken as single pods"
                if listed is not None
                else f"PodGroups ({api.group}) are not visible to you: the pods of its gangs "
                "are taken as single pods"
            )
        found += [(api, item) for item in listed or ()]
    return found, unseen


async def _served(objects: client.CustomObjectsApi, api: GroupApi) -> bool:
    """Whether the apiserver serves `api` (its CRD is installed), as discovery, which every
    user may read, says."""
    try:
        await _read(
            lambda: kube.raw_json(
                objects.get_api_resources(api.group, api.version, _preload_content=False)
            )
        )
    except ApiError as error:
        if error.status not in (FORBIDDEN, 404):
            raise
        return error.status == FORBIDDEN  # not known: it may be
    return True


async def _budgets(policy: client.PolicyV1Api, namespace: str) -> tuple[list[Item], str | None]:
    """Every PodDisruptionBudget, or, where this user may not list them all, those of
    `namespace`; and a line saying what is not visible, if anything."""
    try:
        listed, everywhere = await _everywhere_or_in(
            policy.list_pod_disruption_budget_for_all_namespaces,
            functools.partial(policy.list_namespaced_pod_disruption_budget, namespace),
        )
    except ApiError as error:
        if error.status != FORBIDDEN:
            raise
        return [], (
            "PodDisruptionBudgets are not visible to you: preemption is shown as if none "
            "covered a pod"
        )
    if everywhere:
        return listed, None
    return listed, (
        f"PodDisruptionBudgets of namespaces other than {namespace} are not visible to you: "
        "preemption is shown as if none covered the pods there"
    )


async def _volumes(
    core: client.CoreV1Api, storage: client.StorageV1Api, namespace: str, every_pod: bool
) -> VolumeLists | None:
    """What pods' claims are judged by; None where this user may not read all three kinds,
    or reads every namespace's pods but not every namespace's claims."""
    try:
        claims, everywhere = await _everywhere_or_in(
            core.list_persistent_volume_claim_for_all_namespaces,
            functools.partial(core.list_namespaced_persistent_volume_claim, namespace),
            optional=True,
        )
    except ApiError as error:
        if error.status != FORBIDDEN:
            raise
        return None
    if every_pod and not everywhere:
        return None
    volumes = await _unless_forbidden(list_all(core.list_persistent_volume, optional=True))
    classes = await _unless_forbidden(list_all(storage.list_storage_class, optional=True))
    if volumes is None or classes is None:
        return None
    return VolumeLists(claims=claims, volumes=volumes, classes=classes)


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


SHELL_VARIABLES = frozenset(
    option.env
    for option in OPTIONS
    if option.live or option.field in {"lease_name", "lease_namespace", "webhook_configuration"}
)
"""The operator's variables the CLI reads from its shell: the configuration a leader
publishes (decided with when none leads), and the names of its Lease and webhook."""


def shell_config(environ: Mapping[str, str]) -> OperatorConfig:
    """What the operator would decide with, given this shell's GPUSHARE_* variables (those in
    `SHELL_VARIABLES`); CliError naming a refused one."""
    # Any other GPUSHARE_* is the operator's or the plugin's business, and must not stop a
    # read: Kubernetes even sets GPUSHARE_WEBHOOK_PORT=tcp://... in the pods beside the
    # gpushare-webhook Service. One the CLI decides with is refused even where a leader's
    # Lease would decide instead: whether one leads changes from run to run, and a value the
    # operator would refuse is better said at once than only when it leads no more.
    used = {name: value for name, value in environ.items() if name in SHELL_VARIABLES}
    try:
        return load({}, used)
    except ConfigError as error:
        raise CliError(
            f"this shell's GPUSHARE_* variables, which gpushare decides with when no operator "
            f"leads, are refused ({error}); correct or unset the variable named",
            status=2,
        ) from error


def live_config(shell: OperatorConfig, live: Body) -> OperatorConfig:
    """What the operator decides with: `shell` (its environment), with the live spec applied."""
    spec = path(live, "spec")
    if spec:
        # The operator refuses an invalid one too, and keeps its environment's values.
        with contextlib.suppress(ConfigError):
            return with_live(shell, spec)
    return shell


def load_pod(file: str, namespace: str) -> dict[str, Any]:
    """The Pod manifest in `file` (- for stdin) as the scheduler would first see it:
    pending, in its namespace (else `namespace`), with a uid, on no node. CliError (status 2)
    for what the apiserver would refuse to create, in the fields the CLI reads or changes."""
    try:
        text_in = sys.stdin.read() if file == "-" else Path(file).read_text()
        body = yaml.safe_load(text_in)
    except OSError as error:
        raise CliError(f"cannot read {file}: {error}", status=2) from error
    except yaml.YAMLError as error:
        raise CliError(f"{file} is not valid YAML ({yaml_problem(error)})", status=2) from error
    if not isinstance(body, dict) or body.get("kind") != "Pod":
        raise CliError(f"{file} must hold one Pod manifest (kind: Pod)", status=2)
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise CliError(f"{file}: metadata must be a mapping", status=2)
    spec = body.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise CliError(f"{file}: spec.containers is missing", status=2)
    if (malformed := _malformed(meta, spec)) is not None:
        raise CliError(f"{file}: {malformed} (the apiserver would refuse this Pod)", status=2)
    meta.setdefault("namespace", namespace)
    meta.setdefault("uid", f"simulated-{uuid.uuid4()}")
    body.setdefault("status", {"phase": "Pending"})
    spec.pop("nodeName", None)
    return body


def _malformed(meta: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """The first field of a Pod's that its schema refuses, among those admission and the
    scheduler read; None when they are well formed."""
    for key in ("annotations", "labels"):
        values = meta.get(key)
        if values is not None and not (
            isinstance(values, dict)
            and all(v is None or isinstance(v, str) for v in values.values())
        ):
            return f"metadata.{key} must map names to strings"
        if isinstance(values, dict):  # the apiserver reads a null value (`name:`) as ""
            meta[key] = {name: value or "" for name, value in values.items()}
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"spec.{key} must be a list"
        for at, container in enumerate(containers):
            if not isinstance(container, dict):
                return f"spec.{key}[{at}] must be a mapping"
            resources = container.get("resources")
            if resources is None:
                continue
            if not isinstance(resources, dict):
                return f"spec.{key}[{at}].resources must be a mapping"
            for side in ("limits", "requests"):
                if not isinstance(resources.get(side) or {}, dict):
                    return f"spec.{key}[{at}].resources.{side} must be a mapping"
    return None

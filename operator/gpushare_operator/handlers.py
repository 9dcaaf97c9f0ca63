"""kopf adapters only: each handler hands what it sees to the Runtime.

Pods, nodes and GPUNodes are watched with `@kopf.on.event` and `@kopf.index` alone, so kopf
writes nothing to them: no annotation, finalizer or Event lands on a user's pod or a node.
The indexes exist for one guarantee: kopf calls no event handler before every index has
been filled from the initial listing, so the first event handler call can load the complete
cluster into the cache (`Runtime.sync`) before any decision is taken. They hold slim copies
(only the fields the scheduler reads) to keep memory down on large clusters.

Run it with `kopf run --standalone -A -m gpushare_operator.handlers` or `gpushare-operator`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import kopf

from gpushare import kube, logs
from gpushare.model import contract
from gpushare.model.bodies import Body, mapping, path
from gpushare_operator.config import from_env
from gpushare_operator.kubeapi import CONFIG_PLURAL, KubeSchedulerApi
from gpushare_operator.runtime import Runtime

_RUNTIME = "gpushare"
_SYNC_TIMEOUT_S = 300.0

_POD_SPEC_FIELDS = (
    "nodeName",
    "schedulerName",
    "containers",
    "initContainers",
    "overhead",
    "nodeSelector",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priority",
    "schedulingGates",
)
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def slim_pod(body: Body) -> dict[str, Any]:
    """The fields of a pod the scheduler and the model read."""
    meta = path(body, "metadata")
    spec = path(body, "spec")
    slim_spec = {key: spec[key] for key in _POD_SPEC_FIELDS if key in spec}
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            slim_spec[key] = [
                {f: c[f] for f in _CONTAINER_FIELDS if f in c}
                for c in spec[key]
                if isinstance(c, dict)
            ]
    return {
        "metadata": {
            key: meta[key]
            for key in (
                "name",
                "namespace",
                "uid",
                "annotations",
                "deletionTimestamp",
                "creationTimestamp",
            )
            if key in meta
        },
        "spec": slim_spec,
        "status": {"phase": path(body, "status").get("phase")},
    }


def runtime(memo: Any) -> Runtime:
    found = memo.get(_RUNTIME)
    assert isinstance(found, Runtime), "the startup handler did not run"
    return found


def _plain(body: kopf.Body) -> dict[str, Any]:
    return dict(mapping(body))


@kopf.on.startup()
async def startup(*, settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    config = from_env()
    logs.configure(config.log_level)
    # Log lines must never become Events on users' pods, and cluster-wide watches need no
    # namespace scanning (so the RBAC role needs no namespace list).
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    api_client = await kube.api_client()
    api = KubeSchedulerApi(api_client, identity=config.identity, timeout_s=config.bind_timeout_s)
    state = Runtime(config=config, api=api)
    state.metrics.serve(config.metrics_port)
    memo[_RUNTIME] = state
    memo["gpushare_api_client"] = api_client
    state.start()


@kopf.on.cleanup()
async def cleanup(*, memo: Any, **_: Any) -> None:
    state = memo.get(_RUNTIME)
    if isinstance(state, Runtime):
        await state.stop()
    api_client = memo.get("gpushare_api_client")
    if api_client is not None:
        await api_client.close()


@kopf.index("pods")
async def gpushare_pods(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {str(body.metadata.uid): slim_pod(_plain(body))}


@kopf.index("nodes")
async def gpushare_nodes(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {str(body.metadata.name): _plain(body)}


@kopf.index(contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, contract.INVENTORY_PLURAL)
async def gpushare_gpunodes(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {str(body.metadata.name): _plain(body)}


def _synced(memo: Any, indexes: dict[str, Any]) -> Runtime:
    """The runtime, loaded with the complete indexes on the first event handler call."""
    state = runtime(memo)
    if not state.synced.is_set():
        state.sync(
            nodes=_values(indexes["gpushare_nodes"]),
            gpunodes=_values(indexes["gpushare_gpunodes"]),
            pods=_values(indexes["gpushare_pods"]),
        )
    return state


def _values(index: kopf.Index[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [body for store in index.values() for body in store]


@kopf.on.event("pods")
async def pod_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    _synced(memo, kwargs).pod_event(type, slim_pod(_plain(body)))


@kopf.on.event("nodes")
async def node_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    _synced(memo, kwargs).node_event(type, _plain(body))


@kopf.on.event(contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, contract.INVENTORY_PLURAL)
async def gpunode_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    _synced(memo, kwargs).gpunode_event(type, _plain(body))


@kopf.on.event("namespaces")
async def namespace_event(*, memo: Any, **kwargs: Any) -> None:
    """Namespaces always exist (default, kube-system): their first event opens the cache
    even in a cluster with no pods or nodes yet."""
    _synced(memo, kwargs)


@kopf.on.event(contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, CONFIG_PLURAL)
async def config_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    state = _synced(memo, kwargs)
    name = str(body.metadata.name)
    accepted, message = state.apply_config(
        type, name, mapping(body.get("spec")), _values(kwargs["gpushare_pods"])
    )
    if type != "DELETED" and mapping(body.get("status")).get("message") != message:
        try:
            await state.api.report_config(name, accepted=accepted, message=message)
        except kube.ApiError as error:
            logs.get("operator").warning("config_status_failed", error=str(error))


@kopf.on.probe(id="gpushare")
async def freshness(*, memo: Any, **_: Any) -> dict[str, Any]:
    """Liveness that means something: the cache was loaded, and the API answered recently.

    Fails (so the probe restarts the replica) when the initial sync has not completed after
    5 minutes, or when the Lease calls have had no answer for 3 lease durations."""
    state = runtime(memo)
    now = time.monotonic()
    if not state.synced.is_set() and now - state.started_at > _SYNC_TIMEOUT_S:
        raise kopf.PermanentError("the watches have not listed the cluster after 5 minutes")
    contact = state.elector.last_contact
    if (
        state.config.leader_elect
        and contact is not None
        and (time.time() - contact > 3 * state.config.lease_duration_s)
    ):
        raise kopf.PermanentError("the Kubernetes API has not answered the Lease calls")
    return {
        "synced": state.synced.is_set(),
        "leading": state.leading,
        "seconds_since_event": {k: round(now - v, 1) for k, v in state.last_event.items()},
        "queue": dataclasses.asdict(state.queue.depth()),
    }

"""Every Kubernetes API call the operator makes, behind the `SchedulerApi` protocol.

Writes go to: pods/binding (the bind, with the GPU annotations, and the GPU pod label where
the pod lacks it), pods/status (PodScheduled; the GPU pod label of other pods that lack it),
events (Scheduled, FailedScheduling; these and the bind in protobuf, as kube-scheduler sends
them: gpushare.kube.protobuf), gpunodes/status, gpushareconfigs/status, PodGroups'
status (Volcano's and the coscheduling API's), pods/eviction (a gang's bound pods, when it
fell below its minimum before it ran; preemption's victims; over-users), pods (an over-user
its PodDisruptionBudgets kept past overUseDeleteAfterSeconds, deleted), Leases, the Lease term
on the ValidatingAdmissionPolicyBinding that fences the leader's writes, the admission
webhook's Secret (created once) and its MutatingWebhookConfiguration's caBundle.
Reads of pods, nodes, GPUNodes, PodGroups, PriorityClasses and PodDisruptionBudgets: each
resource's list call, for the Reflector that lists and watches it (gpushare.kube.reflector);
single pods are read back after a refused bind.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, cast

import aiohttp
from kubernetes_asyncio import client

from gpushare.kube import ApiError, protobuf, raw_json, read_pod
from gpushare.kube.clock import rfc3339
from gpushare.kube.http2 import Http2Writer
from gpushare.kube.reflector import ListCall
from gpushare.model import PodRef, contract
from gpushare.model.gangs import PLURAL, GroupApi, GroupKey
from gpushare.model.volumes import BOUND_BY_CONTROLLER, SELECTED_NODE, ClaimKey

COMPONENT = "gpushare-scheduler"
FENCE_PROBE = "gpushare-fence-probe"
"""The pod, never made, whose dry-run Binding asks whether the fence holds a term."""
NO_LABELS: Mapping[str, str] = MappingProxyType({})
"""What a Binding adds to a pod's labels by default (the fence's term labels aside)."""
EVICTION = "/eviction"
POD_PATH = "/pods/"
"""With a DELETE, and the eviction's path: the writes only the leader may send besides
Bindings (`KubeSchedulerApi.fence_leader_writes`)."""
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"  # kube-scheduler's reason


class SchedulerApi(Protocol):
    def lister(self, resource: str) -> ListCall:
        """The list (and watch) call of `pods`, `nodes`, `gpunodes`, `priorityclasses`,
        `poddisruptionbudgets`, `persistentvolumeclaims`, `persistentvolumes`,
        `storageclasses`, or the PodGroups of a `GroupApi` (its name), for a Reflector."""
        ...

    async def promise_volume(
        self, volume: str, version: int, claim: ClaimKey, claim_uid: str
    ) -> dict[str, Any]:
        """Write `claim` in a PersistentVolume's claimRef, if it is still at `version` (the
        PersistentVolume controller then binds the two); the volume as written."""
        ...

    async def select_node(self, claim: ClaimKey, node: str, version: int) -> dict[str, Any]:
        """Write `volumes.SELECTED_NODE` on a PersistentVolumeClaim (its provisioner then makes
        a volume that `node` reaches), if it is still at `version` (-1: whatever its version);
        the claim as written."""
        ...

    async def bind(
        self,
        pod: PodRef,
        node: str,
        annotations: Mapping[str, str],
        labels: Mapping[str, str] = NO_LABELS,
    ) -> None:
        """Bind `pod` to `node`; the apiserver adds `annotations` and `labels` to it."""
        ...

    async def label_gpu_pod(self, pod: PodRef) -> None:
        """Add `contract.GPU_POD_LABEL` to a GPU pod that lacks it."""
        ...

    async def mark_preempted(self, pod: PodRef, message: str) -> None:
        """Give a victim the condition `DisruptionTarget` (reason `PreemptionByScheduler`), as
        kube-scheduler does before it deletes one (the Eviction API adds it on its own), so
        that a Job's `podFailurePolicy` sees a disruption, not a failure; only if it is still
        the pod `pod.uid` names."""
        ...

    async def read_pod(self, pod: PodRef) -> dict[str, Any] | None:
        """The pod as the apiserver has it now; None when it is gone."""
        ...

    async def set_unschedulable(
        self,
        pod: PodRef,
        reason: str,
        message: str,
        resource_version: int | None,
        *,
        transition: bool,
        nominated: str | None = None,
    ) -> None:
        """PodScheduled=False, only on the pod as it was at `resource_version` (ApiError 409
        once it has changed: bound meanwhile, it must not be marked unschedulable).
        `transition`: the condition was not False before, so its lastTransitionTime moves.
        `nominated`: `status.nominatedNodeName` too (the pod preempted there)."""
        ...

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        """Create an Event; its name."""
        ...

    async def post_node_event(
        self, node: str, *, event_type: str, reason: str, message: str
    ) -> None:
        """Create an Event on the Node (`kubectl describe node` shows it)."""
        ...

    async def repeat_event(self, namespace: str, name: str, *, message: str, count: int) -> None:
        """The Event `name` seen again: its message, count and lastTimestamp (ApiError 404
        once it has expired)."""
        ...

    async def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    async def evict(self, pod: PodRef) -> None:
        """Evict the pod (the Eviction API: PodDisruptionBudgets are honoured), only if it is
        still the pod `pod.uid` names."""
        ...

    async def delete_pod(self, pod: PodRef, *, grace_period_s: int | None) -> None:
        """Delete the pod (no PodDisruptionBudget asked: an over-user its budgets kept, when the
        admin opts in; a victim of preemption its budgets would keep), only if it is still the
        pod `pod.uid` names, with this grace period instead of its own (None: its own)."""
        ...

    async def patch_podgroup_status(self, group: GroupKey, status: Mapping[str, Any]) -> None:
        """Merge `status` into the PodGroup's (Volcano's CRD has no status subresource:
        its status is written on the object, as Volcano's scheduler writes it)."""
        ...

    async def report_config(
        self, name: str, *, accepted: bool, message: str, in_force: Mapping[str, Any] | None
    ) -> None:
        """The GPUShareConfig's status: `in_force`, the spec in force (None: the environment's
        values alone), is read back after a restart."""
        ...

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def write_lease(
        self, namespace: str, body: Mapping[str, Any], *, create: bool
    ) -> dict[str, Any]:
        """Create the Lease, or replace it (the body's resourceVersion is the precondition);
        the Lease as written."""
        ...

    async def read_fence(self) -> list[dict[str, Any]] | None:
        """The object selector's requirements of the binding `contract.FENCE_BINDING` (its
        Lease, then its term); None when there is no such binding."""
        ...

    async def set_fence(self, lease: str, before: list[str], term: str) -> None:
        """Have the apiserver refuse the writes of Lease `lease` (`contract.LEASE_LABEL`'s value)
        sent in any term but `term` (`contract.LEASE_TERM_LABEL`'s): set it on the binding
        `contract.FENCE_BINDING`, if that still holds `before` and selects `lease`'s writes
        (else ApiError 422)."""
        ...

    async def fence_holds(self, namespace: str, stamp: TermStamp) -> bool:
        """Whether the apiserver takes a write stamped `stamp` now, or refuses it as sent in a
        term that is over (it rebuilds its policies a second after a change). Asked with a dry
        run of a Binding of a pod that does not exist in `namespace`."""
        ...


async def _unless_absent(call: Awaitable[object]) -> dict[str, Any] | None:
    """The object a read returns; None when it does not exist (404)."""
    try:
        return await raw_json(call)
    except ApiError as error:
        if error.status == 404:
            return None
        raise


class Fenced(Exception):
    """A write only the leader may send, not sent (`WriteFence`) or refused by the apiserver
    (the policy gpushare-leader-writes): this replica may no longer lead."""


@dataclass(frozen=True)
class TermStamp:
    """What a leader's write carries to name the Lease term it is sent in (`WriteFence.stamp`):
    the annotation for people, the labels the fence's binding selects on. Empty without
    leader election."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def _decided_on(version: int, metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` with the resourceVersion a write was decided on, a precondition: the
    apiserver answers 409 when the object changed since (-1: no precondition)."""
    return {**metadata, "resourceVersion": str(version)} if version >= 0 else metadata


def _unfenced(_write: str) -> None:
    """No fence: an operator that does not elect a leader."""


def _ignore_refusal() -> None:
    """Without leader election no write is refused for its term."""


@contextlib.contextmanager
def _term_over(refused: Callable[[], None]) -> Iterator[None]:
    """The policy's refusal of a write sent in a term that is over, raised as Fenced: the
    writers treat it as they treat their own fence's; `refused` is told."""
    try:
        yield
    except ApiError as error:
        if contract.TERM_OVER in error.message:
            refused()
            raise Fenced(error.message) from error
        raise


class KubeSchedulerApi:
    """SchedulerApi over kubernetes_asyncio, reading raw responses (see gpushare.kube)."""

    def __init__(self, api: client.ApiClient, *, identity: str, timeout_s: float) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._scheduling = client.SchedulingV1Api(api)
        self._policy = client.PolicyV1Api(api)
        self._storage = client.StorageV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self._leases = client.CoordinationV1Api(api)
        self._admission = client.AdmissionregistrationV1Api(api)
        self._identity = identity
        self._timeout_of: Callable[[], float] = lambda: timeout_s
        self._writer = Http2Writer(api.configuration, timeout_s=timeout_s, user_agent=COMPONENT)
        self._stamp: Callable[[], TermStamp] = TermStamp
        """The term a leader's write names (`fence_leader_writes`)."""
        self._check_leading: Callable[[str], None] = _unfenced
        """The fence's last ask before a Binding goes out (`fence_leader_writes`)."""
        self._refused: Callable[[], None] = _ignore_refusal
        """Told when the apiserver refuses a write for its term (`fence_leader_writes`)."""

    async def close(self) -> None:
        """Close the HTTP/2 connection of Bindings and Events (the ApiClient is the caller's)."""
        await self._writer.close()

    async def __aenter__(self) -> KubeSchedulerApi:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def _timeout(self) -> float:
        return self._timeout_of()

    def time_out_by(self, timeout_s: Callable[[], float]) -> None:
        """Give each call `timeout_s()` seconds (the live configuration's bindTimeoutSeconds),
        read as it is sent."""
        self._timeout_of = timeout_s

    def fence_leader_writes(
        self,
        check: Callable[[str], None],
        stamp: Callable[[], TermStamp],
        refused: Callable[[], None] = _ignore_refusal,
    ) -> None:
        """Have each Binding and eviction carry `stamp()` (`WriteFence.stamp`: the Lease term
        it is sent in, which the apiserver's binding gpushare-leader-writes compares with the
        term the leader set there), and `check` (`WriteFence.check`, which raises when this
        replica may no longer lead) asked again for each as its bytes are about to go out.
        The writers' own check, made before, cannot see a pause (SIGSTOP, a stalled VM) that
        falls after it: such a bind went out on resume, after the standby had taken over, and
        overfilled a card. A fenced request is refused before a byte is written. A Binding is
        asked as it is handed to its HTTP/2 connection with a stream free for it
        (`Http2Writer`: a TLS handshake lies between only when the connection is new); an
        eviction, and a pod's deletion (which can carry no stamp: preemption past a budget,
        an over-user), once its aiohttp connection is had (on Python 3.11 one turn of the event
        loop still lies between: aiohttp writes the body from a task of its own, started at
        once from 3.12 on), its connection closed. `refused` (`LeaseElector.on_term_refused`)
        is told when the apiserver refuses one for its term."""

        self._stamp = stamp
        self._check_leading = check
        self._refused = refused

        async def headers_ready(
            _session: aiohttp.ClientSession,
            _context: object,
            params: aiohttp.TraceRequestHeadersSentParams,
        ) -> None:
            path = params.url.path
            if path.endswith(EVICTION) or (params.method == "DELETE" and POD_PATH in path):
                check(f"{params.method} {path}")

        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(headers_ready)
        trace.freeze()
        session: aiohttp.ClientSession = self._api.rest_client.pool_manager
        session.trace_configs.append(trace)

    def lister(self, resource: str) -> ListCall:
        listers: dict[str, ListCall] = {
            "pods": self._core.list_pod_for_all_namespaces,
            "nodes": self._core.list_node,
            "priorityclasses": self._scheduling.list_priority_class,
            "poddisruptionbudgets": self._policy.list_pod_disruption_budget_for_all_namespaces,
            "persistentvolumeclaims": self._core.list_persistent_volume_claim_for_all_namespaces,
            "persistentvolumes": self._core.list_persistent_volume,
            "storageclasses": self._storage.list_storage_class,
        }
        if resource in listers:
            return listers[resource]
        if resource in GroupApi.__members__:
            api = GroupApi[resource]
            return functools.partial(
                self._objects.list_cluster_custom_object, api.group, api.version, PLURAL
            )
        return functools.partial(
            self._objects.list_cluster_custom_object,
            contract.INVENTORY_GROUP,
            contract.INVENTORY_VERSION,
            contract.INVENTORY_PLURAL,
        )

    async def bind(
        self,
        pod: PodRef,
        node: str,
        annotations: Mapping[str, str],
        labels: Mapping[str, str] = NO_LABELS,
    ) -> None:
        # The UID precondition makes the bind fail if the pod was replaced by a namesake.
        stamp = self._stamp()
        body = protobuf.binding(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            annotations={**annotations, **stamp.annotations},
            labels={**labels, **stamp.labels},
            node=node,
        )
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding"
        with _term_over(self._refused):
            await self._writer.post_protobuf(
                path,
                body,
                sending=lambda: self._check_leading(f"POST {path}"),
                timeout_s=self._timeout,
            )

    async def promise_volume(
        self, volume: str, version: int, claim: ClaimKey, claim_uid: str
    ) -> dict[str, Any]:
        namespace, name = claim
        reference = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": namespace,
            "name": name,
            "uid": claim_uid,
        }
        # As kube-scheduler writes it (its binder's bindAPIUpdate), with the version decided on.
        metadata = _decided_on(version, {"annotations": {BOUND_BY_CONTROLLER: "yes"}})
        body = {"metadata": metadata, "spec": {"claimRef": reference}}
        return await raw_json(
            self._core.patch_persistent_volume(
                volume, body, _preload_content=False, _request_timeout=self._timeout
            )
        )

    async def select_node(self, claim: ClaimKey, node: str, version: int) -> dict[str, Any]:
        namespace, name = claim
        body = {"metadata": _decided_on(version, {"annotations": {SELECTED_NODE: node}})}
        return await raw_json(
            self._core.patch_namespaced_persistent_volume_claim(
                name, namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
        )

    async def read_pod(self, pod: PodRef) -> dict[str, Any] | None:
        return await read_pod(self._core, pod.name, pod.namespace, pod.uid, timeout_s=self._timeout)

    async def _patch_pod_status(self, pod: PodRef, body: Mapping[str, Any]) -> None:
        """A strategic merge patch of the pod through pods/status."""
        await raw_json(
            self._core.patch_namespaced_pod_status(
                pod.name,
                pod.namespace,
                body,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def label_gpu_pod(self, pod: PodRef) -> None:
        # Through pods/status, the one patch of a pod the operator's role allows; the UID
        # precondition leaves a namesake alone.
        body = {"metadata": {"uid": pod.uid, "labels": dict(contract.GPU_POD_LABELS)}}
        await self._patch_pod_status(pod, body)

    async def mark_preempted(self, pod: PodRef, message: str) -> None:
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": message,
            "lastTransitionTime": rfc3339(),
        }
        # Strategic merge: conditions merge by type. The UID leaves a namesake alone.
        body = {"metadata": {"uid": pod.uid}, "status": {"conditions": [condition]}}
        await self._patch_pod_status(pod, body)

    async def set_unschedulable(
        self,
        pod: PodRef,
        reason: str,
        message: str,
        resource_version: int | None,
        *,
        transition: bool,
        nominated: str | None = None,
    ) -> None:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
        }
        if transition:  # else the merge keeps the time it became False
            condition["lastTransitionTime"] = rfc3339()
        # Strategic merge: conditions merge by type; the pod's other conditions stay. The
        # resourceVersion makes it a precondition: the write was decided on that pod.
        body: dict[str, Any] = {"status": {"conditions": [condition]}}
        if nominated is not None:  # as kube-scheduler nominates a pod that preempted
            body["status"]["nominatedNodeName"] = nominated
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": str(resource_version)}
        await self._patch_pod_status(pod, body)

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        created = await self._post_event(
            pod.namespace,
            pod.name,
            pod.uid,
            kind="Pod",
            event_type=event_type,
            reason=reason,
            message=message,
        )
        try:
            return protobuf.field(created, 1, 1)  # metadata.name
        except ValueError:  # created, but its name unreadable: a later repeat posts anew
            return ""

    async def post_node_event(
        self, node: str, *, event_type: str, reason: str, message: str
    ) -> None:
        # The node's name as its uid, as the kubelet's: `kubectl describe node` looks up by it.
        await self._post_event(
            "", node, node, kind="Node", event_type=event_type, reason=reason, message=message
        )

    async def _post_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        kind: str,
        event_type: str,
        reason: str,
        message: str,
    ) -> bytes:
        """Create an Event about `kind` `namespace/name` ("" for a cluster-scoped object)."""
        body = protobuf.event(
            namespace=namespace,
            name=name,
            uid=uid,
            event_type=event_type,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self._identity,
            at_s=int(time.time()),
            kind=kind,
        )
        kept_in = namespace or protobuf.EVENTS_OF_CLUSTER_OBJECTS
        path = f"/api/v1/namespaces/{kept_in}/events"
        return await self._writer.post_protobuf(path, body, timeout_s=self._timeout)

    async def repeat_event(self, namespace: str, name: str, *, message: str, count: int) -> None:
        change = {"message": message, "count": count, "lastTimestamp": rfc3339()}
        await raw_json(
            self._core.patch_namespaced_event(
                name,
                namespace,
                change,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> None:
        # A JSON Patch (the client's default for custom objects): replace the whole status.
        await raw_json(
            self._objects.patch_cluster_custom_object_status(
                contract.INVENTORY_GROUP,
                contract.INVENTORY_VERSION,
                contract.INVENTORY_PLURAL,
                name,
                [{"op": "add", "path": "/status", "value": dict(status)}],
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def evict(self, pod: PodRef) -> None:
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "annotations": dict((stamp := self._stamp()).annotations),
                "labels": dict(stamp.labels),
            },
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        }
        with _term_over(self._refused):
            await raw_json(
                self._core.create_namespaced_pod_eviction(
                    pod.name,
                    pod.namespace,
                    cast(client.V1Eviction, eviction),
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )

    async def delete_pod(self, pod: PodRef, *, grace_period_s: int | None) -> None:
        options: dict[str, Any] = {"preconditions": {"uid": pod.uid}}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        await raw_json(
            self._core.delete_namespaced_pod(
                pod.name,
                pod.namespace,
                body=cast(client.V1DeleteOptions, options),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def patch_podgroup_status(self, group: GroupKey, status: Mapping[str, Any]) -> None:
        api = group.api
        patch = (
            self._objects.patch_namespaced_custom_object
            if api is GroupApi.VOLCANO
            else self._objects.patch_namespaced_custom_object_status
        )
        await raw_json(
            patch(
                api.group,
                api.version,
                group.namespace,
                PLURAL,
                group.name,
                {"status": dict(status)},
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def report_config(
        self, name: str, *, accepted: bool, message: str, in_force: Mapping[str, Any] | None
    ) -> None:
        status: dict[str, Any] = {"accepted": accepted, "message": message, "observedAt": rfc3339()}
        if in_force is not None:
            status["inForce"] = in_force
        await raw_json(
            self._objects.patch_cluster_custom_object_status(
                contract.CONFIG_GROUP,
                contract.CONFIG_VERSION,
                contract.CONFIG_PLURAL,
                name,
                [{"op": "add", "path": "/status", "value": status}],
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _unless_absent(
            self._leases.read_namespaced_lease(
                name, namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )

    async def write_lease(
        self, namespace: str, body: Mapping[str, Any], *, create: bool
    ) -> dict[str, Any]:
        if create:
            return await raw_json(
                self._leases.create_namespaced_lease(
                    namespace,
                    cast(client.V1Lease, dict(body)),
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
        return await raw_json(
            self._leases.replace_namespaced_lease(
                body["metadata"]["name"],
                namespace,
                cast(client.V1Lease, dict(body)),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def fence_holds(self, namespace: str, stamp: TermStamp) -> bool:
        # Admission judges the Binding before the pod is looked up: not refused, it is a 404.
        body = {
            "metadata": {
                "name": FENCE_PROBE,
                "annotations": dict(stamp.annotations),
                "labels": dict(stamp.labels),
            },
            "target": {"kind": "Node", "name": FENCE_PROBE},
        }
        try:
            with _term_over(_ignore_refusal):
                await raw_json(
                    self._core.create_namespaced_pod_binding(
                        FENCE_PROBE,
                        namespace,
                        cast(client.V1Binding, body),
                        dry_run="All",
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    )
                )
        except Fenced:
            return False
        except ApiError as error:
            if error.status != 404:
                raise
        return True

    async def read_fence(self) -> list[dict[str, Any]] | None:
        binding = await _unless_absent(
            self._admission.read_validating_admission_policy_binding(
                contract.FENCE_BINDING, _preload_content=False, _request_timeout=self._timeout
            )
        )
        if binding is None:
            return None
        selector = (binding.get("spec") or {}).get("matchResources") or {}
        return list((selector.get("objectSelector") or {}).get("matchExpressions") or [])

    async def set_fence(self, lease: str, before: list[str], term: str) -> None:
        # A JSON Patch of the one value that changes, on the condition that the binding is as
        # read: another replica's term set meanwhile, or a binding of another shape, is a 422.
        selector = "/spec/matchResources/objectSelector/matchExpressions"
        expected = {
            "0/key": contract.LEASE_LABEL,
            "0/operator": "In",
            "0/values": [lease],
            "1/key": contract.LEASE_TERM_LABEL,
            "1/operator": "NotIn",
            "1/values": before,
        }
        await raw_json(
            self._admission.patch_validating_admission_policy_binding(
                contract.FENCE_BINDING,
                [
                    *(
                        {"op": "test", "path": f"{selector}/{at}", "value": v}
                        for at, v in expected.items()
                    ),
                    {"op": "replace", "path": f"{selector}/1/values", "value": [term]},
                ],
                field_manager=COMPONENT,  # who holds the term, in a conflict's message
                _content_type="application/json-patch+json",  # type: ignore[call-arg]
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    # -- the admission webhook's certificate ------------------------------------------------

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _unless_absent(
            self._core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )

    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> None:
        """ApiError 409 when another replica made it first."""
        await raw_json(
            self._core.create_namespaced_secret(
                namespace,
                cast(client.V1Secret, dict(body)),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    async def delete_secret(self, namespace: str, name: str, uid: str | None) -> None:
        """Delete the Secret if it is still the one with `uid`; gone already is fine."""
        options = {"preconditions": {"uid": uid}} if uid else {}
        try:
            await raw_json(
                self._core.delete_namespaced_secret(
                    name,
                    namespace,
                    body=cast(client.V1DeleteOptions, options),
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    async def read_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        return await _unless_absent(
            self._admission.read_mutating_webhook_configuration(
                name, _preload_content=False, _request_timeout=self._timeout
            )
        )

    async def set_ca_bundle(self, name: str, webhook_names: list[str], ca_bundle: str) -> None:
        """Each webhook's clientConfig.caBundle, by position, each position tested for its
        name so that a configuration changed since it was read is refused (422), not garbled."""
        patch: list[dict[str, Any]] = []
        for position, webhook in enumerate(webhook_names):
            patch.append({"op": "test", "path": f"/webhooks/{position}/name", "value": webhook})
            patch.append(
                {
                    "op": "add",
                    "path": f"/webhooks/{position}/clientConfig/caBundle",
                    "value": ca_bundle,
                }
            )
        await raw_json(
            self._admission.patch_mutating_webhook_configuration(
                name,
                patch,
                _content_type="application/json-patch+json",  # type: ignore[call-arg]
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

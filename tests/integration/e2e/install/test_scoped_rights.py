"""What the shipped policies let each identity write, tried against the real apiserver with the
manifests applied: the device plugin's token (bound to its Node, as its pod's token is) writes
only its own node's objects and only the fields it owns; the operator's only the caBundle of
its webhook configuration; nobody else, cluster admins included, changes a pod's placement
record; no container names its own cards in its env."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from cluster import bind_pod, create_pod, eventually, gpu_pod
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube import ApiError, raw_json
from gpushare.model import contract, pod_ref
from gpushare.model.gangs import COSCHEDULING_GROUP_LABEL, VOLCANO_GROUP_ANNOTATIONS
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.identities import (
    OPERATOR,
    PLUGIN,
    operator_kubeconfig,
    plugin_kubeconfig,
    tenant_kubeconfig,
    token,
    token_kubeconfig,
)
from gpushare_operator.election import LeaseTerm
from gpushare_operator.kubeapi import Fenced, KubeSchedulerApi

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def kubectl(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


async def refusal(call: Callable[..., Awaitable[object]]) -> str:
    """The apiserver's message for a refused `call`. Server-side dry runs (`call(dry_run=
    "All")`, which change nothing) wait out the moment the policies take to reach the
    apiserver's admission chain after they are created; then the call itself is made."""

    async def refused(**dry_run: str) -> str | None:
        try:
            await raw_json(call(**dry_run))
        except ApiError as error:
            return error.message if error.status in {403, 422} else None
        return None

    await eventually(lambda: refused(dry_run="All"), timeout_s=20, what="the policy in force")
    message = await refused()
    assert message is not None, "refused in a dry run, but not when made"
    return message


@pytest_asyncio.fixture
async def installed(plane: ControlPlane, api: client.ApiClient) -> client.CoreV1Api:
    applied = kubectl(plane, "apply", "-k", str(MANIFESTS))
    assert applied.returncode == 0, applied.stderr
    core = client.CoreV1Api(api)
    for name in ("n1", "n2"):
        await create_gpu_node(core, FakeGpuNode(name=name, gpu_memory=0, gpu_number=8))
    return core


def labelled(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the admission webhook leaves it (no operator serves it here)."""
    pod["metadata"]["labels"] = {contract.GPU_POD_LABEL: contract.GPU_POD_LABEL_VALUE}
    return pod


async def placed(core: client.CoreV1Api, name: str, node: str) -> dict[str, Any]:
    pod = await create_pod(core, labelled(gpu_pod(name, number=1)))
    await bind_pod(
        core,
        pod,
        node,
        {contract.GPU_INDEX: "0", contract.GPU_ASSIGNED: "false", contract.PREDICATE_TIME: "1"},
    )
    return pod


def annotate(
    core: client.CoreV1Api, name: str, annotations: dict[str, str | None], **dry_run: Any
) -> Awaitable[object]:
    return patch_metadata(core, name, {"annotations": annotations}, **dry_run)


def relabel(
    core: client.CoreV1Api, name: str, labels: dict[str, str | None], **dry_run: Any
) -> Awaitable[object]:
    return patch_metadata(core, name, {"labels": labels}, **dry_run)


def patch_metadata(
    core: client.CoreV1Api, name: str, metadata: dict[str, Any], **dry_run: Any
) -> Awaitable[object]:
    """A merge patch of the pod's metadata (None removes a key)."""
    return core.patch_namespaced_pod(
        name,
        "default",
        {"metadata": metadata},
        _content_type=MERGE,  # type: ignore[call-arg]
        _preload_content=False,
        **dry_run,
    )


async def test_the_device_plugins_token_writes_only_its_own_nodes_objects(
    installed: client.CoreV1Api, plane: ControlPlane, tmp_path: Path
) -> None:
    core = installed
    for name, node in (("on-n1", "n1"), ("on-n2", "n2")):
        await placed(core, name, node)
    config = await plugin_kubeconfig(core, plane.kubeconfig, "n1", tmp_path / "plugin")
    async with await kube.api_client(config) as api:
        plugin = client.CoreV1Api(api)
        objects = client.CustomObjectsApi(api)
        served: dict[str, str | None] = {contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_TRUE}

        # An annotation no other policy guards: the refusal is this policy's alone (with
        # gpu-assigned, the placement policy refuses too, and either may answer first).
        other_node = await refusal(lambda **dry: annotate(plugin, "on-n2", {"team": "a"}, **dry))
        assert "device plugin of node n1 may write only its own node's objects" in other_node
        await raw_json(annotate(plugin, "on-n1", served))  # its own node: allowed
        labelled = await refusal(lambda **dry: annotate(plugin, "on-n1", {"team": "a"}, **dry))
        assert "may change only the annotation volcano.sh/gpu-assigned" in labelled
        moved = await refusal(
            lambda **dry: annotate(plugin, "on-n1", {contract.GPU_INDEX: "3"}, **dry)
        )
        # Refused by this policy and the placement policy: the apiserver tells either.
        assert any(
            m in moved
            for m in ("may change only the annotation volcano.sh/gpu-assigned", "pod-placement")
        )
        node_relabelled = await refusal(
            lambda **dry: plugin.patch_node(
                "n1", {"metadata": {"labels": {"gpushare": "false"}}}, _preload_content=False, **dry
            )
        )
        assert "may change only the annotation volcano.sh/gpu-unhealthy-ids" in node_relabelled
        cordon = await refusal(
            lambda **dry: plugin.patch_node(
                "n1", {"spec": {"unschedulable": True}}, _preload_content=False, **dry
            )
        )
        assert "volcano.sh/gpu-unhealthy-ids" in cordon
        unhealthy = {"metadata": {"annotations": {contract.GPU_UNHEALTHY_IDS: "1"}}}
        await raw_json(plugin.patch_node("n1", unhealthy, _preload_content=False))
        other = await refusal(
            lambda **dry: plugin.patch_node("n2", unhealthy, _preload_content=False, **dry)
        )
        assert "not nodes n2" in other
        gpunode = {
            "apiVersion": f"{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}",
            "kind": contract.INVENTORY_KIND,
            "metadata": {"name": "n2"},
            "spec": {"memoryUnitMiB": 512, "cards": []},
        }
        foreign = await refusal(
            lambda **dry: objects.create_cluster_custom_object(
                contract.INVENTORY_GROUP,
                contract.INVENTORY_VERSION,
                contract.INVENTORY_PLURAL,
                gpunode,
                _preload_content=False,
                **dry,
            )
        )
        assert "not gpunodes n2" in foreign
        # Status subresources: the role grants none, so RBAC refuses them (the policy does not
        # match them, so that kubelets' status writes do not pay for it).
        statuses = {
            "pods/status": lambda **dry: plugin.patch_namespaced_pod_status(
                "on-n1", "default", {"metadata": {"labels": {"team": "a"}}},
                _preload_content=False, **dry,
            ),
            "nodes/status": lambda **dry: plugin.patch_node_status(
                "n1", {"metadata": {"labels": {"gpushare": "false"}}},
                _preload_content=False, **dry,
            ),
            "gpunodes/status": lambda **dry: objects.patch_cluster_custom_object_status(
                contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, contract.INVENTORY_PLURAL,
                "n1", {"status": {}}, _preload_content=False, **dry,
            ),
        }  # fmt: skip
        for resource, write in statuses.items():
            refused = await refusal(write)
            assert f'cannot patch resource "{resource}"' in refused, refused
    # A token bound to no node (a Secret's long-lived token, say) writes nothing.
    loose = token_kubeconfig(
        plane.kubeconfig, tmp_path / "loose", PLUGIN[1], await token(core, PLUGIN)
    )
    async with await kube.api_client(loose) as api:
        refused = await refusal(
            lambda **dry: annotate(client.CoreV1Api(api), "on-n1", served, **dry)
        )
        assert "token is bound to no node" in refused


def create(core: client.CoreV1Api, pod: dict[str, Any], **dry_run: Any) -> Awaitable[object]:
    return core.create_namespaced_pod(
        "default", cast(client.V1Pod, pod), _preload_content=False, **dry_run
    )


async def test_the_operators_token_changes_only_its_webhooks_ca_bundle(
    installed: client.CoreV1Api, plane: ControlPlane, tmp_path: Path
) -> None:
    config = await operator_kubeconfig(installed, plane.kubeconfig, tmp_path / "operator")
    async with await kube.api_client(config) as api:
        admission = client.AdmissionregistrationV1Api(api)

        def patch(operations: list[dict[str, Any]], **dry_run: Any) -> Awaitable[object]:
            return admission.patch_mutating_webhook_configuration(
                "gpushare",
                operations,
                _content_type=JSON_PATCH,  # type: ignore[call-arg]
                _preload_content=False,
                **dry_run,
            )

        for change in (
            [{"op": "add", "path": "/webhooks/0/rules/0/resources/-", "value": "secrets"}],
            [{"op": "remove", "path": "/webhooks/0/matchConditions"}],
            [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}],
            [{"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "x"}],
        ):
            refused = await refusal(lambda c=change, **dry: patch(c, **dry))
            assert "may change only the caBundle" in refused, change
        bundle = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Zm9v"}]
        await raw_json(patch(bundle))
    assert OPERATOR[1] in config.read_text()


LEASE_UID = "8c1e4b2a-0d6f-4c3e-9a57-2b1f0e9d7c64"
FENCE = "/spec/matchResources/objectSelector/matchExpressions"
"""Where the binding gpushare-leader-writes keeps its Lease (0) and the term now (1)."""


def lease_term(holder: str, transitions: int, namespace: str = OPERATOR[0]) -> LeaseTerm:
    return LeaseTerm(
        namespace=namespace,
        name="gpushare-scheduler",
        holder=holder,
        transitions=transitions,
        uid=LEASE_UID,
    )


async def test_a_binding_or_eviction_sent_in_a_lease_term_that_is_over_is_refused(
    installed: client.CoreV1Api, plane: ControlPlane, tmp_path: Path
) -> None:
    """A replica paused between its check of the Lease and its write resumes with the write
    still to send: the binding gpushare-leader-writes holds the term the leader set on it, and
    the apiserver refuses the writes of the Lease sent in any other."""
    core = installed
    for name in ("late", "other"):
        await create_pod(core, labelled(gpu_pod(name, number=1)))
    now, over = lease_term("op-b", 4), lease_term("op-a", 3)
    config = await operator_kubeconfig(core, plane.kubeconfig, tmp_path / "operator")
    async with await kube.api_client(config) as api:
        operator = client.CoreV1Api(api)

        def write(kind: str, pod: str, term: LeaseTerm | None, **dry_run: Any) -> Awaitable[object]:
            metadata: dict[str, Any] = {"name": pod}
            if term is not None:  # as the operator sends it: the term, and its labels
                metadata["annotations"] = dict(term.stamp().annotations)
                metadata["labels"] = dict(term.stamp().labels)
            if kind == "Binding":
                body = {"metadata": metadata, "target": {"kind": "Node", "name": "n1"}}
                return operator.create_namespaced_pod_binding(
                    pod, "default", cast(client.V1Binding, body), _preload_content=False, **dry_run
                )
            return operator.create_namespaced_pod_eviction(
                pod,
                "default",
                cast(client.V1Eviction, {"metadata": metadata}),
                _preload_content=False,
                **dry_run,
            )

        # Before any leader set its term, the binding refuses every term of the Lease.
        unset = await refusal(lambda **dry: write("Binding", "late", now, **dry))
        assert f"the binding of pod default/late {contract.TERM_OVER} ({now})" in unset
        async with KubeSchedulerApi(api, identity="op-b", timeout_s=30) as scheduler:
            assert not await scheduler.fence_holds(OPERATOR[0], now.stamp())
            await scheduler.set_fence(now.lease_label, ["none"], now.label)  # its own right
            # What the elector asks before it leads: the apiserver takes the term's writes
            # once it rebuilt its policies, and from then on refuses the term before's.
            await eventually(
                lambda: scheduler.fence_holds(OPERATOR[0], now.stamp()),
                timeout_s=20,
                what="the term now taken",
            )
            assert not await scheduler.fence_holds(OPERATOR[0], over.stamp())
            assert not await scheduler.fence_holds(OPERATOR[0], now.stamp_of_no_term())
        stale = await refusal(lambda **dry: write("Binding", "late", over, **dry))
        assert f"the binding of pod default/late {contract.TERM_OVER} ({over})" in stale
        await raw_json(write("Binding", "late", now))
        bound = await raw_json(core.read_namespaced_pod("late", "default", _preload_content=False))
        assert bound["spec"]["nodeName"] == "n1"
        assert bound["metadata"]["annotations"][contract.LEADER_TERM] == str(now)
        evicted = await refusal(lambda **dry: write("Eviction", "late", over, **dry))
        assert f"the eviction of pod default/late {contract.TERM_OVER}" in evicted
        await raw_json(write("Eviction", "late", now, dry_run="All"))
        # Not judged: a write without a term (kube-scheduler's Bindings), or another Lease's.
        await raw_json(write("Binding", "other", None, dry_run="All"))
        elsewhere = lease_term("op-a", 3, namespace="elsewhere")
        await raw_json(write("Binding", "other", elsewhere, dry_run="All"))

        # The operator's client takes the refusal as its fence's (the writers requeue), and
        # tells the elector, which sets its term again if it still leads.
        told: list[str] = []
        async with KubeSchedulerApi(api, identity="op-a", timeout_s=30) as scheduler:
            scheduler.fence_leader_writes(lambda _: None, over.stamp, lambda: told.append("x"))
            other = core.read_namespaced_pod("other", "default", _preload_content=False)
            ref = pod_ref(await raw_json(other))
            with pytest.raises(Fenced, match=contract.TERM_OVER):
                await scheduler.bind(ref, "n1", {})
            late = core.read_namespaced_pod("late", "default", _preload_content=False)
            with pytest.raises(Fenced, match=contract.TERM_OVER):
                await scheduler.evict(pod_ref(await raw_json(late)))
        assert told == ["x", "x"]


async def test_the_operator_alone_sets_the_lease_term_on_the_fences_binding(
    installed: client.CoreV1Api, plane: ControlPlane, tmp_path: Path
) -> None:
    admin = client.AdmissionregistrationV1Api(installed.api_client)  # type: ignore[attr-defined]
    term = lease_term("op-a", 7)
    replace = [{"op": "replace", "path": f"{FENCE}/1/values", "value": [term.label]}]

    def patch(
        api: client.ApiClient, name: str = contract.FENCE_BINDING, **dry_run: Any
    ) -> Awaitable[object]:
        return client.AdmissionregistrationV1Api(api).patch_validating_admission_policy_binding(
            name,
            replace,
            _content_type=JSON_PATCH,  # type: ignore[call-arg]
            _preload_content=False,
            **dry_run,
        )

    tenant = await tenant_kubeconfig(installed, plane.kubeconfig, "default", tmp_path / "tenant")
    async with await kube.api_client(tenant) as api:
        assert "forbidden" in await refusal(lambda **dry: patch(api, **dry))
    config = await operator_kubeconfig(installed, plane.kubeconfig, tmp_path / "operator")
    async with await kube.api_client(config) as api:
        # RBAC names this binding alone.
        assert "forbidden" in await refusal(lambda **dry: patch(api, "gpushare-gpu-pods", **dry))
        async with KubeSchedulerApi(api, identity="op-a", timeout_s=30) as scheduler:
            requirements = await scheduler.read_fence()
            assert requirements is not None
            assert requirements[1]["values"] == ["none"]
            await scheduler.set_fence(term.lease_label, ["none"], term.label)
            # Its JSON Patch tests the binding as read: its Lease, and the term it replaces.
            for lease, before in (("elsewhere.lease", [term.label]), (term.lease_label, ["x"])):
                with pytest.raises(ApiError) as changed:
                    await scheduler.set_fence(lease, before, "1." + LEASE_UID)
                assert changed.value.status == 422
    binding = await raw_json(
        admin.read_validating_admission_policy_binding(
            contract.FENCE_BINDING, _preload_content=False
        )
    )
    selector = binding["spec"]["matchResources"]["objectSelector"]["matchExpressions"]
    assert selector[0]["values"] == [term.lease_label]
    assert selector[1]["values"] == [term.label]


async def test_a_pods_placement_record_is_written_by_gpushare_alone(
    installed: client.CoreV1Api,
) -> None:
    core = installed  # the admin: system:masters, and refused all the same
    pod = await placed(core, "p", "n1")
    edits: list[dict[str, str | None]] = [
        {contract.GPU_INDEX: "1"},
        {contract.GPU_INDEX: None},
        {contract.GPU_ASSIGNED: "true"},
        {contract.PREDICATE_TIME: "99999999999999999999"},
        {contract.GPU_MEMORY_MIB: "cuda-container=11178"},
    ]
    for edit in edits:
        refused = await refusal(lambda e=edit, **dry: annotate(core, "p", e, **dry))
        assert "gpushare's record of where it placed the pod" in refused, edit
        assert "delete it and create it anew" in refused
    status = await refusal(
        lambda **dry: core.patch_namespaced_pod_status(
            "p",
            "default",
            {"metadata": {"annotations": {contract.GPU_INDEX: "2"}}},
            _preload_content=False,
            **dry,
        )
    )
    assert "volcano.sh/gpu-index" in status
    await raw_json(annotate(core, "p", {"team": "a"}))  # other annotations are the owner's
    # The label that puts the pod under the policy is part of the record.
    for value in (None, "false"):
        change = {contract.GPU_POD_LABEL: value}
        refused = await refusal(lambda r=change, **dry: relabel(core, "p", r, **dry))
        assert "label gpushare.io/gpu-pod of a pod belong to gpushare's record" in refused, value
    both = await refusal(
        lambda **dry: core.patch_namespaced_pod_status(
            "p",
            "default",
            {
                "metadata": {
                    "labels": {contract.GPU_POD_LABEL: None},
                    "annotations": {contract.GPU_INDEX: "2"},
                }
            },
            _preload_content=False,
            **dry,
        )
    )
    assert "annotation(s) volcano.sh/gpu-index and label gpushare.io/gpu-pod" in both
    await raw_json(relabel(core, "p", {"team": "a"}))  # other labels too
    # The gang a pod joined at creation: joined later, a bound pod would tie its fate to a
    # gang's in preemption. Volcano's default gang alone may be added, as its PodGroup
    # controller adds it to a pod of its scheduler name that names none.
    for gang in (
        lambda **dry: annotate(core, "p", {VOLCANO_GROUP_ANNOTATIONS[0]: "g"}, **dry),
        lambda **dry: annotate(core, "p", {VOLCANO_GROUP_ANNOTATIONS[1]: "g"}, **dry),
        lambda **dry: relabel(core, "p", {COSCHEDULING_GROUP_LABEL: "g"}, **dry),
    ):
        assert "gpushare's record of where it placed the pod" in await refusal(gang)
    volcano: dict[str, str | None] = {
        VOLCANO_GROUP_ANNOTATIONS[0]: f"podgroup-{pod['metadata']['uid']}"
    }
    await raw_json(annotate(core, "p", volcano))
    moved = await refusal(
        lambda **dry: annotate(core, "p", {VOLCANO_GROUP_ANNOTATIONS[0]: "other"}, **dry)
    )
    assert f"annotation(s) {VOLCANO_GROUP_ANNOTATIONS[0]} of a pod belong" in moved
    # Nor does a pod leave the gang it joined at creation.
    member = labelled(gpu_pod("member", number=1))
    member["metadata"]["labels"][COSCHEDULING_GROUP_LABEL] = "g"
    member["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[1]: "g"}
    await bind_pod(core, await create_pod(core, member), "n1", {contract.GPU_INDEX: "1"})
    for leave in (
        lambda **dry: relabel(core, "member", {COSCHEDULING_GROUP_LABEL: None}, **dry),
        lambda **dry: annotate(core, "member", {VOLCANO_GROUP_ANNOTATIONS[1]: None}, **dry),
    ):
        assert "gpushare's record of where it placed the pod" in await refusal(leave)
    # A pod without GPUs is not judged (its writes cost the apiserver no policy): its
    # annotations are its owner's, whatever their names.
    plain = gpu_pod("plain")
    plain["spec"]["containers"][0]["resources"] = {}
    await raw_json(create(core, plain))
    await raw_json(annotate(core, "plain", {contract.GPU_INDEX: "0", contract.GPU_MEMORY_MIB: "x"}))
    # Anyone may add the label (as the operator does to GPU pods made before it existed): the
    # pod is judged from then on.
    await raw_json(relabel(core, "plain", {contract.GPU_POD_LABEL: contract.GPU_POD_LABEL_VALUE}))
    now_judged = await refusal(
        lambda **dry: annotate(core, "plain", {contract.GPU_INDEX: "1"}, **dry)
    )
    assert "annotation(s) volcano.sh/gpu-index of a pod belong to gpushare's record" in now_judged
    forged = labelled(gpu_pod("forged", number=1))
    forged["metadata"]["annotations"] = {contract.GPU_INDEX: "0"}
    created = await refusal(lambda **dry: create(core, forged, **dry))
    assert "are written by gpushare alone, when it places the pod: remove them" in created


async def test_no_container_names_its_own_cards_outside_exempt_namespaces(
    installed: client.CoreV1Api, plane: ControlPlane
) -> None:
    core = installed
    pod = labelled(gpu_pod("sees-all", number=1))
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    refused = await refusal(lambda **dry: create(core, pod, **dry))
    assert "container cuda-container sets NVIDIA_VISIBLE_DEVICES" in refused
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "env": [{"name": "VOLCANO_GPU_ALLOCATED", "value": "99999"}],
                }
            ]
        },
    }
    refused = await refusal(lambda **dry: create(core, plain, **dry))
    assert "container c sets VOLCANO_GPU_ALLOCATED" in refused
    await create_pod(core, labelled(gpu_pod("debuggee", number=1)))
    debug = {
        "spec": {
            "ephemeralContainers": [
                {
                    "name": "debug",
                    "image": "x",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ]
        }
    }
    ephemeral = await refusal(
        lambda **dry: core.patch_namespaced_pod_ephemeralcontainers(
            "debuggee",
            "default",
            debug,
            _content_type="application/strategic-merge-patch+json",  # type: ignore[call-arg]
            _preload_content=False,
            **dry,
        )
    )
    assert "container debug sets NVIDIA_VISIBLE_DEVICES" in ephemeral
    # The device plugin's own namespace is exempt: its pod reads every card through NVML.
    exempt = {**plain, "metadata": {"name": "plugin-like"}}
    await create_pod(core, exempt, namespace="gpushare-device-plugin")

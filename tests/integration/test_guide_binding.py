"""The guide's scenario against a real kube-apiserver: a Binding carries the GPU annotations
and the apiserver writes them together with spec.nodeName; a replica that may no longer lead
sends none."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cluster import bind_pod, events_of
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.kube.clock import parse_time
from gpushare.model import (
    CardIndex,
    Ledger,
    Placement,
    Policy,
    claim_of,
    contract,
    gpu_request,
    node_inventory,
    place,
    pod_ref,
)
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_operator.election import LeaseTerm, WriteFence
from gpushare_operator.kubeapi import COMPONENT, Fenced, KubeSchedulerApi

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def guide_pod(name: str, namespace: str) -> client.V1Pod:
    """gpu-pod1 of the user guide, unchanged but for the namespace."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1PodSpec(
            scheduler_name="volcano",
            containers=[
                client.V1Container(
                    name="cuda-container",
                    image="nvidia/cuda:9.0-devel",
                    command=["sleep"],
                    args=["100000"],
                    resources=client.V1ResourceRequirements(limits={contract.GPU_MEMORY: "1024"}),
                )
            ],
        ),
    )


async def raw_pod(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, Any]:
    return await raw_json(core.read_namespaced_pod(name, namespace, _preload_content=False))


async def test_a_binding_writes_node_and_gpu_annotations_together(
    core: client.CoreV1Api, namespace: str, unique: str
) -> None:
    node_name = f"gpu-node-{unique}"
    node = await create_gpu_node(core, FakeGpuNode(name=node_name, gpu_memory=89424, gpu_number=8))
    assert node["status"]["capacity"][contract.GPU_MEMORY] == "89424"
    assert not node["spec"].get("taints"), "fake GPU nodes must carry no not-ready taint"

    await core.create_namespaced_pod(namespace, guide_pod("gpu-pod1", namespace))
    pod = await raw_pod(core, "gpu-pod1", namespace)

    # What the scheduler decides, from the objects as the apiserver returns them.
    inventory = node_inventory(node)
    assert inventory is not None
    ledger = Ledger()
    ledger.set_node(inventory)
    placement = place(ledger, gpu_request(pod), Policy.BESTFIT)
    assert isinstance(placement, Placement)
    assert (placement.node, placement.cards) == (node_name, (0,))

    predicate_time = str(time.time_ns())
    annotations = {
        **placement.allocation(pod_ref(pod)).annotations(),
        contract.PREDICATE_TIME: predicate_time,
    }
    await bind_pod(core, pod, node_name, annotations)

    bound = await raw_pod(core, "gpu-pod1", namespace)
    assert bound["spec"]["nodeName"] == node_name
    assert bound["metadata"]["annotations"] == {
        contract.GPU_INDEX: "0",
        contract.PREDICATE_TIME: predicate_time,
    }
    scheduled = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["status"] == "True"

    # Rebuilt from the bound pod alone, the usage is the guide's: card 0 holds 1024 MiB.
    rebuilt = Ledger()
    rebuilt.set_node(inventory)
    claim = claim_of(bound)
    assert claim.problem is None
    assert claim.allocation is not None
    rebuilt.add(claim.allocation)
    usage = rebuilt.node(inventory.node)
    assert usage is not None
    assert usage.cards[CardIndex(0)].used == 1024


async def test_a_second_binding_of_a_bound_pod_is_refused_with_a_conflict(
    core: client.CoreV1Api, namespace: str, unique: str
) -> None:
    node_name = f"gpu-node-{unique}"
    await create_gpu_node(core, FakeGpuNode(name=node_name, gpu_memory=89424, gpu_number=8))
    await core.create_namespaced_pod(namespace, guide_pod("gpu-pod2", namespace))
    pod = await raw_pod(core, "gpu-pod2", namespace)
    await bind_pod(core, pod, node_name, {contract.GPU_INDEX: "0"})
    with pytest.raises(ApiError) as caught:
        await bind_pod(core, pod, node_name, {contract.GPU_INDEX: "1"})
    assert caught.value.status == 409
    again = await raw_pod(core, "gpu-pod2", namespace)
    assert again["metadata"]["annotations"][contract.GPU_INDEX] == "0"


async def test_a_binding_for_a_replaced_pod_is_refused_and_says_why(
    core: client.CoreV1Api, namespace: str, unique: str
) -> None:
    node_name = f"gpu-node-{unique}"
    await create_gpu_node(core, FakeGpuNode(name=node_name, gpu_memory=89424, gpu_number=8))
    await core.create_namespaced_pod(namespace, guide_pod("gpu-pod3", namespace))
    pod = await raw_pod(core, "gpu-pod3", namespace)
    stale = {**pod, "metadata": {**pod["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
    with pytest.raises(ApiError) as caught:
        await bind_pod(core, stale, node_name, {contract.GPU_INDEX: "0"})
    assert caught.value.status == 409
    assert "UID" in caught.value.message  # the apiserver's Status, read from protobuf
    assert "nodeName" not in (await raw_pod(core, "gpu-pod3", namespace))["spec"]


async def test_the_scheduled_event_reads_as_kubectl_shows_it(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    await core.create_namespaced_pod(namespace, guide_pod("gpu-pod4", namespace))
    pod = await raw_pod(core, "gpu-pod4", namespace)
    async with KubeSchedulerApi(api_client, identity="gpushare-0", timeout_s=30) as api:
        message = "Successfully assigned ns/gpu-pod4 to n, card 0 (10.0 GiB free left on the card)"
        name = await api.post_event(
            pod_ref(pod), event_type="Normal", reason="Scheduled", message=message
        )
        assert name.startswith("gpu-pod4.")
        [event] = await events_of(core, "gpu-pod4", namespace)
        assert event["metadata"]["name"] == name
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": "gpu-pod4",
            "uid": pod["metadata"]["uid"],
        }
        shown = (event["type"], event["reason"], event["message"])
        assert shown == ("Normal", "Scheduled", message)
        assert event["source"] == {"component": COMPONENT}
        reporter = (event["reportingComponent"], event["reportingInstance"])
        assert reporter == (COMPONENT, "gpushare-0")
        assert event["count"] == 1
        assert event["firstTimestamp"] == event["lastTimestamp"]
        assert abs(parse_time(event["lastTimestamp"]) - time.time()) < 60  # type: ignore[operator]

        await api.repeat_event(namespace, name, message="again", count=2)
        [again] = await events_of(core, "gpu-pod4", namespace)
        assert (again["message"], again["count"]) == ("again", 2)


async def test_a_binding_eviction_or_deletion_refused_by_the_fence_as_it_goes_out_is_never_sent(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    # The writers ask the fence before they call; this is the last ask, once the request has
    # its connection, for a replica paused in between (the Lease was stale by the time).
    await core.create_namespaced_pod(namespace, guide_pod("gpu-pod5", namespace))
    pod = pod_ref(await raw_pod(core, "gpu-pod5", namespace))
    async with KubeSchedulerApi(api_client, identity="gpushare-0", timeout_s=30) as api:
        leading = [False]
        term = LeaseTerm(
            namespace="gpushare-system",
            name="gpushare-scheduler",
            holder="gpushare-0",
            transitions=0,
            uid="8c1e4b2a-0d6f-4c3e-9a57-2b1f0e9d7c64",
        )
        fence = WriteFence(lambda: leading[0], lambda: term)
        api.fence_leader_writes(fence.check, fence.stamp)
        with pytest.raises(Fenced, match="binding not sent"):
            await api.bind(pod, "n", {contract.GPU_INDEX: "0"})
        with pytest.raises(Fenced, match="eviction not sent"):
            await api.evict(pod)
        with pytest.raises(Fenced, match="pods/gpu-pod5 not sent"):  # no stamp for the apiserver
            await api.delete_pod(pod, grace_period_s=None)
        assert "nodeName" not in (await raw_pod(core, "gpu-pod5", namespace))["spec"]
        await api.post_event(pod, event_type="Normal", reason="Test", message="other writes go on")

        leading[0] = True
        await api.bind(pod, "n", {contract.GPU_INDEX: "0"})
        bound = await raw_pod(core, "gpu-pod5", namespace)
        assert bound["spec"]["nodeName"] == "n"
        # The term it was sent in, and the labels the fence's binding selects the Binding by
        # (the apiserver copies a Binding's labels to the pod too, from 1.35 on).
        assert bound["metadata"]["annotations"][contract.LEADER_TERM] == (
            "gpushare-system/gpushare-scheduler/gpushare-0/0"
        )
        assert (
            bound["metadata"]["labels"].items()
            >= {
                contract.LEASE_LABEL: "gpushare-system.gpushare-scheduler",
                contract.LEASE_TERM_LABEL: "0.8c1e4b2a-0d6f-4c3e-9a57-2b1f0e9d7c64",
            }.items()
        )

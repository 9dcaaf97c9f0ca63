"""Pods with PersistentVolumeClaims: where the operator places them, what it writes on a claim
that waits for its first consumer, and when it binds the pod (after the claim is bound)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from decision_loop import decision_loop, run_a_while, running, settle

from gpushare.kube import ApiError
from gpushare.model import PodRef
from gpushare.model.volumes import (
    BIND_COMPLETED,
    SELECTED_NODE,
    ClaimKey,
    claim_facts,
    class_facts,
    volume_facts,
)
from gpushare_operator.config import OperatorConfig
from gpushare_operator.intake import Intake
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.podinfo import PodInfo

pytestmark = pytest.mark.asyncio
CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), backoff_initial_s=5)


class Api:
    """Claims written as the apiserver writes them (`claims`), Bindings and reports kept."""

    def __init__(self, claims: Mapping[ClaimKey, dict[str, Any]]) -> None:
        self.claims = {key: copy.deepcopy(body) for key, body in claims.items()}
        self.selected: list[tuple[str, str]] = []
        self.promised: list[tuple[str, str, str]] = []
        self.volume_version = 4  # `local_volume`'s, as the apiserver has it
        self.binds: list[tuple[str, str]] = []
        self.conditions: list[str] = []
        self.refuse_claims: ApiError | None = None

    async def select_node(self, claim: ClaimKey, node: str, version: int) -> dict[str, Any]:
        if self.refuse_claims is not None:
            raise self.refuse_claims
        body = self.claims[claim]
        if version < 0 or version != int(body["metadata"]["resourceVersion"]):
            # The test's claims all have versions: a write without its precondition is a bug.
            raise ApiError(409, "the object has been modified")
        self.selected.append((claim[1], node))
        body["metadata"].setdefault("annotations", {})[SELECTED_NODE] = node
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(body)

    async def promise_volume(
        self, volume: str, version: int, claim: ClaimKey, claim_uid: str
    ) -> dict[str, Any]:
        if version != self.volume_version:
            raise ApiError(409, "the object has been modified")
        self.promised.append((volume, claim[1], claim_uid))
        written = local_volume(volume, "b")
        written["spec"]["claimRef"] = {"namespace": claim[0], "name": claim[1], "uid": claim_uid}
        written["metadata"]["resourceVersion"] = str(version + 1)
        return written

    async def bind(
        self, pod: PodRef, node: str, annotations: Mapping[str, str], labels: Mapping[str, str] = {}
    ) -> None:
        self.binds.append((pod.name, node))

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        return "event"

    async def set_unschedulable(
        self, pod: PodRef, reason: str, message: str, *_: Any, **__: Any
    ) -> None:
        self.conditions.append(message)


def claim(
    name: str, storage_class: str = "fast", *, volume: str | None = None, version: int = 1
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"claim-{name}",
            "resourceVersion": str(version),
            "annotations": {},
        },
        "spec": {"storageClassName": storage_class},
    }
    if volume is not None:
        body["spec"]["volumeName"] = volume
        body["metadata"]["annotations"][BIND_COMPLETED] = "yes"
    return body


def storage_class(
    name: str, mode: str = "WaitForFirstConsumer", provisioner: str = "disk.example.com"
) -> dict[str, Any]:
    return {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}


def volume(name: str, *, on_node: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": {}}
    if on_node is not None:
        body["spec"]["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [on_node]}
                        ]
                    }
                ]
            }
        }
    return body


def local_volume(name: str, on_node: str) -> dict[str, Any]:
    """A pre-provisioned volume of class local that only `on_node` reaches."""
    body = volume(name, on_node=on_node)
    body["metadata"]["resourceVersion"] = "4"
    body["spec"].update(
        {
            "storageClassName": "local",
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
        }
    )
    body["status"] = {"phase": "Available"}
    return body


def node(name: str) -> dict[str, Any]:
    body = ready_node(name, 20000, 2)
    body["metadata"]["labels"] = {"kubernetes.io/hostname": name}
    return body


def provision(intake: Intake, claim_name: str, node_name: str) -> None:
    """What the provisioner and the PersistentVolume controller do for a claim given
    `node_name`: a volume there, bound to the claim."""
    intake.volume_event("ADDED", volume_facts(volume("pv-1", on_node=node_name)))
    provisioned = claim(claim_name, volume="pv-1", version=5)
    provisioned["metadata"]["annotations"][SELECTED_NODE] = node_name
    intake.claim_event("MODIFIED", claim_facts(provisioned))


def pod_with_claims(name: str, *claims: str, memory: int = 6000) -> PodInfo:
    body = gpu_pod(name, memory, uid=name)
    body["metadata"]["resourceVersion"] = "10"
    body["spec"]["volumes"] = [
        {"name": f"v-{claim}", "persistentVolumeClaim": {"claimName": claim}} for claim in claims
    ]
    return PodInfo.parse(body)


def operator(
    api: Api,
    *,
    claims: list[dict[str, Any]],
    volumes: Sequence[dict[str, Any]] = (),
    clock: list[float] | None = None,
) -> tuple[Scheduler, Intake]:
    now = clock or [100.0]
    scheduler, intake = decision_loop(api, CONFIG, queue_clock=lambda: now[0])
    for name in ("a", "b"):
        intake.node_event("ADDED", node(name))
    intake.class_event("ADDED", class_facts(storage_class("fast")))
    intake.class_event("ADDED", class_facts(storage_class("slow", "Immediate")))
    local = storage_class("local", provisioner="kubernetes.io/no-provisioner")
    intake.class_event("ADDED", class_facts(local))
    intake.listed_classes({"fast", "slow", "local"}, "1")
    for body in volumes:
        intake.volume_event("ADDED", volume_facts(body))
    for body in claims:
        intake.claim_event("ADDED", claim_facts(body))
    intake.listed_claims({f"default/{c['metadata']['name']}" for c in claims}, "1")
    return scheduler, intake


async def test_a_claim_that_waits_for_its_first_consumer_gets_the_pods_node_before_the_pod() -> (
    None
):
    data = claim("data")
    api = Api({("default", "data"): data})
    scheduler, intake = operator(api, claims=[data])
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod_with_claims("p", "data"))
        await settle()
        assert len(api.selected) == 1
        chosen = api.selected[0][1]
        assert api.binds == []  # the provisioner has not bound the claim yet
        # The provisioner makes a volume on the node; the PV controller binds the claim.
        provision(intake, "data", chosen)
        await settle()
    assert api.binds == [("p", chosen)]
    assert api.conditions == []


async def test_a_pod_whose_claim_was_given_back_by_its_provisioner_is_not_bound_there() -> None:
    data = claim("data")
    api = Api({("default", "data"): data})
    scheduler, intake = operator(api, claims=[data])
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod_with_claims("p", "data"))
        await settle()
        chosen = api.selected[0][1]
        # The provisioner could not make a volume there: it takes the node off the claim.
        intake.claim_event("MODIFIED", claim_facts(claim("data", version=9)))
        await settle()
    assert api.binds == []
    assert api.conditions == [
        f"binding volumes: persistentvolumeclaim default/data was given back by its "
        f"provisioner (it could not provision a volume on node {chosen})"
    ]


async def test_a_pod_goes_where_its_bound_volume_reaches() -> None:
    data = claim("data", volume="pv-b")
    api = Api({})
    scheduler, intake = operator(api, claims=[data], volumes=[volume("pv-b", on_node="b")])
    intake.pod_event("ADDED", pod_with_claims("p", "data"))
    await run_a_while(scheduler, intake)
    assert api.binds == [("p", "b")]
    assert api.selected == []


async def test_a_claim_given_a_node_takes_its_pod_there_alone() -> None:
    data = claim("data")
    data["metadata"]["annotations"][SELECTED_NODE] = "b"
    api = Api({("default", "data"): data})
    scheduler, intake = operator(api, claims=[data])
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod_with_claims("p", "data"))
        await settle()
        assert api.selected == []  # it has its node: nothing to write
        bound = claim("data", volume="pv-b", version=3)
        bound["metadata"]["annotations"][SELECTED_NODE] = "b"
        intake.volume_event("ADDED", volume_facts(volume("pv-b", on_node="b")))
        intake.claim_event("MODIFIED", claim_facts(bound))
        await settle()
    assert api.binds == [("p", "b")]


async def test_a_pod_waits_while_its_immediate_claim_is_unbound_and_a_missing_claim_is_named() -> (
    None
):
    api = Api({})
    scheduler, intake = operator(api, claims=[claim("logs", "slow")])
    intake.pod_event("ADDED", pod_with_claims("p", "logs"))
    intake.pod_event("ADDED", pod_with_claims("q", "nowhere"))
    await run_a_while(scheduler, intake)
    assert api.binds == []
    said = sorted(api.conditions)
    assert len(said) == 2
    assert said[0].startswith(
        '0/2 nodes are available: 2 persistentvolumeclaim "nowhere" not found.'
    )
    assert said[1].startswith(
        "0/2 nodes are available: 2 pod has unbound immediate PersistentVolumeClaims."
    )


async def test_a_pod_waiting_for_its_claim_is_placed_once_the_claim_is_bound() -> None:
    api = Api({})
    clock = [100.0]
    scheduler, intake = operator(
        api, claims=[claim("logs", "slow")], volumes=[volume("pv-l")], clock=clock
    )
    intake.pod_event("ADDED", pod_with_claims("p", "logs"))
    await run_a_while(scheduler, intake)
    assert api.binds == []
    clock[0] += 60  # past its backoff
    intake.claim_event("MODIFIED", claim_facts(claim("logs", "slow", volume="pv-l", version=2)))
    await run_a_while(scheduler, intake)
    assert [pod for pod, _ in api.binds] == ["p"]


async def test_a_claim_the_apiserver_refuses_to_write_is_said_on_the_pod() -> None:
    data = claim("data")
    api = Api({("default", "data"): data})
    api.refuse_claims = ApiError(403, 'persistentvolumeclaims "data" is forbidden')
    scheduler, intake = operator(api, claims=[data])
    intake.pod_event("ADDED", pod_with_claims("p", "data"))
    await run_a_while(scheduler, intake)
    assert api.binds == []
    assert api.conditions == [
        "binding volumes: persistentvolumeclaim default/data: "
        '403: persistentvolumeclaims "data" is forbidden'
    ]
    # The card it was given is free again.
    assert intake.cache.ledger.nodes()
    assert all(
        usage.cards[card].used == 0
        for usage in intake.cache.ledger.nodes().values()
        for card in usage.cards
    )


async def test_a_pod_deleted_while_its_claim_waits_is_never_bound() -> None:
    data = claim("data")
    api = Api({("default", "data"): data})
    scheduler, intake = operator(api, claims=[data])
    pod = pod_with_claims("p", "data")
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod)
        await settle()
        chosen = api.selected[0][1]
        intake.pod_event("DELETED", pod)
        provision(intake, "data", chosen)
        await settle()
    assert api.binds == []


async def test_pods_that_share_a_waiting_claim_are_given_one_node() -> None:
    shared = claim("shared")
    api = Api({("default", "shared"): shared})
    scheduler, intake = operator(api, claims=[shared])
    async with running(scheduler, intake):
        # Both decided before the claim's write comes back (the nodes are alike: best-fit
        # would put the second on the other node's empty card if the claim did not say).
        intake.pod_event("ADDED", pod_with_claims("p", "shared"))
        intake.pod_event("ADDED", pod_with_claims("q", "shared", memory=5000))
        await settle()
        assert len(api.selected) == 1
        chosen = api.selected[0][1]
        provision(intake, "shared", chosen)
        await settle()
    assert sorted(api.binds) == [("p", chosen), ("q", chosen)]


async def test_a_claim_given_another_node_since_the_decision_is_not_overwritten() -> None:
    data = claim("data")
    api = Api({("default", "data"): data})
    api.claims[("default", "data")]["metadata"]["resourceVersion"] = "7"  # changed unseen
    scheduler, intake = operator(api, claims=[data])
    intake.pod_event("ADDED", pod_with_claims("p", "data"))
    await run_a_while(scheduler, intake)
    assert api.selected == []
    assert api.binds == []


async def test_pods_waiting_for_their_claims_leave_the_binds_in_flight_to_others() -> None:
    data = claim("data")
    api = Api({("default", "data"): data})
    scheduler, intake = decision_loop(
        api,
        OperatorConfig(scheduler_names=frozenset({"volcano"}), max_concurrent_binds=1),
        queue_clock=lambda: 100.0,
    )
    intake.node_event("ADDED", node("a"))
    intake.class_event("ADDED", class_facts(storage_class("fast")))
    intake.claim_event("ADDED", claim_facts(data))
    intake.listed_claims({"default/data"}, "1")
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod_with_claims("p", "data"))
        await settle()
        plain = gpu_pod("q", 1000, uid="q")
        plain["metadata"]["resourceVersion"] = "11"
        intake.pod_event("ADDED", PodInfo.parse(plain))
        await settle()
    assert api.selected == [("data", "a")]
    assert api.binds == [("q", "a")]


async def test_a_claim_made_for_a_named_volume_waits_for_the_volume_controller() -> None:
    prebound = claim("data")
    prebound["spec"]["volumeName"] = "pv-1"  # named, the binding not complete
    api = Api({("default", "data"): prebound})
    scheduler, intake = operator(api, claims=[prebound], volumes=[volume("pv-1", on_node="b")])
    intake.pod_event("ADDED", pod_with_claims("p", "data"))
    await run_a_while(scheduler, intake)
    assert api.selected == []
    assert api.binds == []
    assert api.conditions[0].startswith(
        "0/2 nodes are available: 2 pod has unbound immediate PersistentVolumeClaims."
    )


async def test_a_claim_is_given_a_pre_provisioned_volume_and_its_pod_goes_where_that_is() -> None:
    data = claim("data", "local")
    data["spec"]["accessModes"] = ["ReadWriteOnce"]
    data["spec"]["resources"] = {"requests": {"storage": "10Gi"}}
    api = Api({("default", "data"): data})
    scheduler, intake = operator(api, claims=[data], volumes=[local_volume("disk-b", "b")])
    async with running(scheduler, intake):
        intake.pod_event("ADDED", pod_with_claims("p", "data"))
        await settle()
        assert api.promised == [("disk-b", "data", "claim-data")]
        assert api.selected == []  # nothing to provision
        assert api.binds == []  # until the PersistentVolume controller binds the claim
        bound = claim("data", "local", volume="disk-b", version=6)
        intake.claim_event("MODIFIED", claim_facts(bound))
        await settle()
    assert api.binds == [("p", "b")]


async def test_a_volume_changed_since_the_decision_is_not_taken() -> None:
    data = claim("data", "local")
    data["spec"]["accessModes"] = ["ReadWriteOnce"]
    data["spec"]["resources"] = {"requests": {"storage": "10Gi"}}
    api = Api({("default", "data"): data})
    api.volume_version = 8  # written by someone else, unseen yet
    scheduler, intake = operator(api, claims=[data], volumes=[local_volume("disk-b", "b")])
    intake.pod_event("ADDED", pod_with_claims("p", "data"))
    await run_a_while(scheduler, intake)
    assert api.promised == []
    assert api.binds == []

"""A pod's claims against nodes, as kube-scheduler's VolumeBinding judges them."""

from __future__ import annotations

from typing import Any

from gpushare.model.filters import NodeFacts
from gpushare.model.volumes import (
    BIND_COMPLETED,
    BIND_CONFLICT,
    MISSING_VOLUME,
    NODE_CONFLICT,
    SELECTED_NODE,
    UNBOUND_IMMEDIATE,
    ClaimBinding,
    ClaimNeeds,
    VolumeBook,
    claim_facts,
    class_facts,
    pod_volumes,
    volume_facts,
)


def node(name: str, zone: str) -> NodeFacts:
    return NodeFacts(
        name=name,
        ready=True,
        unschedulable=False,
        labels={"topology.kubernetes.io/zone": zone},
        taints=(),
        allocatable={},
    )


def pod(*volumes: dict[str, Any], name: str = "p", uid: str = "pod-uid") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"volumes": list(volumes)},
    }


def claim(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}, "spec": spec}


def zonal_volume(name: str, zone: str) -> dict[str, Any]:
    term = {
        "matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
        ]
    }
    return {
        "metadata": {"name": name},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}},
    }


def book(*claims: dict[str, Any], **classes: dict[str, Any]) -> VolumeBook:
    volumes = VolumeBook(listed=True)
    for body in claims:
        volumes.observe_claim(claim_facts(body))
    for name, body in classes.items():
        volumes.observe_class(class_facts({"metadata": {"name": name}, **body}))
    return volumes


WAITS = {"provisioner": "disk.example.com", "volumeBindingMode": "WaitForFirstConsumer"}
CLAIM_VOLUME = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}


def test_a_pod_without_claims_has_no_volumes_to_judge() -> None:
    assert pod_volumes(pod({"name": "scratch", "emptyDir": {}})) is None


def test_a_bound_claim_takes_its_pod_to_the_zone_of_its_volume() -> None:
    bound = claim("data", volumeName="pv-1")
    bound["metadata"]["annotations"] = {BIND_COMPLETED: "yes"}
    volumes = book(bound)
    volumes.observe_volume(volume_facts(zonal_volume("pv-1", "z1")))
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) is None
    assert needs.reason(node("b", "z2")) == NODE_CONFLICT
    assert needs.binding("a") is None  # nothing to provision


def test_a_claim_bound_to_a_volume_that_is_gone_fits_no_node() -> None:
    bound = claim("data", volumeName="pv-gone")
    bound["metadata"]["annotations"] = {BIND_COMPLETED: "yes"}
    needs = book(bound).needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == MISSING_VOLUME


def test_a_volume_named_but_not_yet_bound_is_an_unbound_claim() -> None:
    # The PV controller has not completed the binding: kube-scheduler waits for it too.
    named = claim("data", volumeName="pv-1", storageClassName="")
    needs = book(named).needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert needs == UNBOUND_IMMEDIATE


def test_a_waiting_claim_is_provisioned_only_in_its_class_topologies() -> None:
    topologies = [
        {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["z2"]}]}
    ]
    volumes = book(
        claim("data", storageClassName="zonal"), zonal={**WAITS, "allowedTopologies": topologies}
    )
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == BIND_CONFLICT
    assert needs.reason(node("b", "z2")) is None
    assert needs.binding("b") == ClaimBinding(
        node="b", select=((("ns", "data"), 1),), wait=(("ns", "data"),)
    )


def test_a_claim_given_a_node_is_not_given_another() -> None:
    given = claim("data", storageClassName="fast")
    given["metadata"]["annotations"] = {SELECTED_NODE: "b"}
    needs = book(given, fast=WAITS).needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == BIND_CONFLICT
    assert needs.binding("b") == ClaimBinding(node="b", select=(), wait=(("ns", "data"),))


def test_a_claim_of_a_class_without_provisioner_is_refused_with_the_fix() -> None:
    local = {
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    needs = book(claim("data", storageClassName="local"), local=local).needs(
        pod_volumes(pod(CLAIM_VOLUME))  # type: ignore[arg-type]
    )
    assert isinstance(needs, str)
    assert 'StorageClass "local" has no provisioner' in needs
    assert "spec.volumeName" in needs


def test_an_ephemeral_volume_waits_for_its_claim_and_accepts_only_its_own() -> None:
    ephemeral = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
    volumes = pod_volumes(pod(ephemeral, name="trainer", uid="u-1"))
    assert volumes is not None
    assert book().needs(volumes) == (
        "waiting for ephemeral volume controller to create the persistentvolumeclaim "
        '"trainer-scratch"'
    )
    foreign = claim("trainer-scratch", storageClassName="fast")
    foreign["metadata"]["ownerReferences"] = [{"uid": "someone-else", "controller": True}]
    assert book(foreign, fast=WAITS).needs(volumes) == (
        "PVC ns/trainer-scratch was not created for pod ns/trainer (pod is not owner)"
    )
    own = claim("trainer-scratch", storageClassName="fast")
    own["metadata"]["ownerReferences"] = [{"uid": "u-1", "controller": True}]
    assert isinstance(book(own, fast=WAITS).needs(volumes), ClaimNeeds)


def test_a_claim_being_deleted_or_missing_keeps_the_pod_off_every_node() -> None:
    going = claim("data")
    going["metadata"]["deletionTimestamp"] = "2026-12-08T00:00:00Z"
    volumes = pod_volumes(pod(CLAIM_VOLUME))
    assert volumes is not None
    assert book(going).needs(volumes) == 'persistentvolumeclaim "data" is being deleted'
    assert book().needs(volumes) == 'persistentvolumeclaim "data" not found'


def test_an_older_copy_of_a_claim_never_replaces_a_newer_one() -> None:
    newer = claim("data", storageClassName="fast")
    newer["metadata"]["resourceVersion"] = "9"
    newer["metadata"]["annotations"] = {SELECTED_NODE: "b"}
    volumes = book(newer)
    assert not volumes.observe_claim(claim_facts(claim("data", storageClassName="fast")))
    assert volumes.claims[("ns", "data")].selected_node == "b"


def test_a_bind_waits_until_the_claim_is_bound_to_a_volume_the_node_reaches() -> None:
    waiting = claim("data", storageClassName="fast")
    waiting["metadata"]["annotations"] = {SELECTED_NODE: "a"}
    volumes = book(waiting, fast=WAITS)
    binding = ClaimBinding(node="a", select=(), wait=(("ns", "data"),))
    assert volumes.binding_state(binding, node("a", "z1")) == ""
    bound = claim("data", storageClassName="fast", volumeName="pv-1")
    bound["metadata"]["resourceVersion"] = "2"
    bound["metadata"]["annotations"] = {SELECTED_NODE: "a", BIND_COMPLETED: "yes"}
    volumes.observe_claim(claim_facts(bound))
    assert volumes.binding_state(binding, node("a", "z1")) == ""  # the volume not yet seen
    volumes.observe_volume(volume_facts(zonal_volume("pv-1", "z2")))
    assert volumes.binding_state(binding, node("a", "z1")) == (
        "persistentvolume pv-1, provisioned for persistentvolumeclaim ns/data, cannot be "
        "reached from node a (its node affinity)"
    )
    volumes.observe_volume(volume_facts(zonal_volume("pv-1", "z1")))
    assert volumes.binding_state(binding, node("a", "z1")) is None

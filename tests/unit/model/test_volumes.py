"""A pod's claims against nodes, as kube-scheduler's VolumeBinding judges them."""

from __future__ import annotations

from typing import Any

from gpushare.model.filters import NodeFacts
from gpushare.model.volume_binding import (
    BIND_CONFLICT,
    MISSING_VOLUME,
    NODE_CONFLICT,
    UNBOUND_IMMEDIATE,
    ClaimBinding,
    ClaimNeeds,
    VolumeBook,
)
from gpushare.model.volumes import (
    BIND_COMPLETED,
    SELECTED_NODE,
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
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"}
    return {"metadata": meta, "spec": spec}


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
    assert needs.binding(node("a", "z1")) is None  # nothing to provision


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
    assert needs.binding(node("b", "z2")) == ClaimBinding(
        node="b", select=((("ns", "data"), 1),), wait=(("ns", "data"),)
    )


def test_a_claim_given_a_node_is_not_given_another() -> None:
    given = claim("data", storageClassName="fast")
    given["metadata"]["annotations"] = {SELECTED_NODE: "b"}
    needs = book(given, fast=WAITS).needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == BIND_CONFLICT
    assert needs.binding(node("b", "z1")) == ClaimBinding(
        node="b", select=(), wait=(("ns", "data"),)
    )


LOCAL = {"provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"}


def local_volume(
    name: str, zone: str, size: str, *, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    body = zonal_volume(name, zone)
    body["metadata"]["labels"] = labels or {}
    body["metadata"]["resourceVersion"] = "3"
    body["spec"].update(
        {
            "storageClassName": "local",
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            **spec,
        }
    )
    body["status"] = {"phase": "Available"}
    return body


def local_claim(name: str, size: str = "10Gi", **spec: Any) -> dict[str, Any]:
    return claim(
        name,
        storageClassName="local",
        accessModes=["ReadWriteOnce"],
        resources={"requests": {"storage": size}},
        **spec,
    )


def test_a_claim_takes_the_smallest_available_volume_that_fits_it_on_the_node() -> None:
    volumes = book(local_claim("data"), local=LOCAL)
    for body in (
        local_volume("small", "z1", "5Gi"),  # too small
        local_volume("big", "z1", "100Gi"),
        local_volume("right", "z1", "20Gi"),
        local_volume("other-zone", "z2", "10Gi"),
        local_volume("many-readers", "z1", "10Gi", accessModes=["ReadOnlyMany"]),
        local_volume("raw", "z1", "10Gi", volumeMode="Block"),
    ):
        volumes.observe_volume(volume_facts(body))
    taken = local_volume("taken", "z1", "10Gi", claimRef={"namespace": "ns", "name": "x"})
    volumes.observe_volume(volume_facts(taken))
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    binding = needs.binding(node("a", "z1"))
    assert binding is not None
    assert [bind.volume for bind in binding.bind] == ["right"]
    assert binding.select == ()  # nothing to provision
    assert needs.binding(node("b", "z2")).bind[0].volume == "other-zone"  # type: ignore[union-attr]
    assert needs.reason(node("c", "z3")) == BIND_CONFLICT  # no volume there, no provisioner


def test_a_claims_selector_and_a_volume_made_for_it_decide_which_it_takes() -> None:
    selective = local_claim("data", selector={"matchLabels": {"disk": "nvme"}})
    volumes = book(selective, local=LOCAL)
    volumes.observe_volume(volume_facts(local_volume("sata", "z1", "10Gi")))
    volumes.observe_volume(
        volume_facts(local_volume("nvme", "z1", "50Gi", labels={"disk": "nvme"}))
    )
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert needs.binding(node("a", "z1")).bind[0].volume == "nvme"  # type: ignore[union-attr]
    made = local_volume("made", "z2", "10Gi", claimRef={"namespace": "ns", "name": "data"})
    made["status"]["phase"] = "Pending"
    volumes.observe_volume(volume_facts(made))
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == BIND_CONFLICT  # only the one made for it
    chosen = needs.binding(node("b", "z2"))
    assert chosen is not None
    assert chosen.bind[0].volume == "made"
    assert chosen.bind[0].promised  # its claimRef names the claim already: nothing to write


def test_a_volume_given_to_one_claim_is_not_given_to_another() -> None:
    volumes = book(local_claim("data"), local_claim("logs"), local=LOCAL)
    volumes.observe_volume(volume_facts(local_volume("only", "z1", "10Gi")))
    both = pod(CLAIM_VOLUME, {"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}})
    needs = volumes.needs(pod_volumes(both))  # type: ignore[arg-type]
    assert isinstance(needs, ClaimNeeds)
    assert needs.reason(node("a", "z1")) == BIND_CONFLICT  # one volume, two claims
    alone = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    assert isinstance(alone, ClaimNeeds)
    binding = alone.binding(node("a", "z1"))
    assert binding is not None
    volumes.select(binding)  # decided: the next decision sees the volume taken
    other = pod({"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}, name="q")
    later = volumes.needs(pod_volumes(other))  # type: ignore[arg-type]
    assert isinstance(later, ClaimNeeds)
    assert later.reason(node("a", "z1")) == BIND_CONFLICT
    volumes.unselect(binding)  # its write failed
    again = volumes.needs(pod_volumes(other))  # type: ignore[arg-type]
    assert isinstance(again, ClaimNeeds)
    assert again.reason(node("a", "z1")) is None


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
        "persistentvolume pv-1, bound to persistentvolumeclaim ns/data, cannot be "
        "reached from node a (its node affinity)"
    )
    volumes.observe_volume(volume_facts(zonal_volume("pv-1", "z1")))
    assert volumes.binding_state(binding, node("a", "z1")) is None


def test_a_claim_takes_only_a_volume_of_its_attributes_class() -> None:
    gold = local_claim("data", volumeAttributesClassName="gold")
    volumes = book(gold, local=LOCAL)
    silver = local_volume("silver", "z1", "10Gi", volumeAttributesClassName="silver")
    volumes.observe_volume(volume_facts(silver))
    promised = local_volume(
        "promised-silver",
        "z1",
        "10Gi",
        volumeAttributesClassName="silver",
        claimRef={"namespace": "ns", "name": "data", "uid": "uid-data"},
    )
    volumes.observe_volume(volume_facts(promised))
    volumes.observe_volume(
        volume_facts(local_volume("golden", "z1", "20Gi", volumeAttributesClassName="gold"))
    )
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    binding = needs.binding(node("a", "z1"))  # type: ignore[union-attr]
    assert binding is not None
    assert [bind.volume for bind in binding.bind] == ["golden"]


def test_a_bind_fails_when_its_volume_is_given_back() -> None:
    volumes = book(local_claim("data"), local=LOCAL)
    volumes.observe_volume(volume_facts(local_volume("disk", "z1", "10Gi")))
    needs = volumes.needs(pod_volumes(pod(CLAIM_VOLUME)))  # type: ignore[arg-type]
    binding = needs.binding(node("a", "z1"))  # type: ignore[union-attr]
    assert binding is not None
    volumes.select(binding)
    assert volumes.binding_state(binding, node("a", "z1")) == ""
    # A relist at the same version does not undo what was decided.
    volumes.observe_volume(volume_facts(local_volume("disk", "z1", "10Gi")))
    assert volumes.binding_state(binding, node("a", "z1")) == ""
    reset = local_volume("disk", "z1", "10Gi")
    reset["metadata"]["resourceVersion"] = "9"  # someone took its claimRef back
    volumes.observe_volume(volume_facts(reset))
    assert volumes.binding_state(binding, node("a", "z1")) == (
        "persistentvolume disk, given to persistentvolumeclaim ns/data, was given back (its "
        "claimRef was reset)"
    )

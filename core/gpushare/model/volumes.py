"""PersistentVolumeClaims, PersistentVolumes and StorageClasses as the scheduler reads them
(`volume_binding` judges a pod's claims with them), and the claims a pod's volumes name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

from gpushare.model.bodies import (
    Body,
    annotations_of,
    mapping,
    path,
    resource_version,
    sequence,
    text,
)
from gpushare.model.errors import GpuShareError
from gpushare.model.filters import NodeFacts, requirement_matches, term_matches
from gpushare.model.quantity import parse_decimal

ClaimKey = tuple[str, str]
"""(namespace, name) of a PersistentVolumeClaim."""

SELECTED_NODE = "volume.kubernetes.io/selected-node"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
"""Read before `spec.storageClassName`, as Kubernetes reads a claim's and a volume's class."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
FILESYSTEM = "Filesystem"


@dataclass(frozen=True, slots=True)
class Claim:
    """What the scheduler reads of a PersistentVolumeClaim."""

    key: ClaimKey
    volume: str | None
    """The PersistentVolume it is bound to, once the binding is complete; None before."""
    named_volume: str | None
    """`spec.volumeName`, complete or not (a claim made for a given volume: pre-bound)."""
    lost: bool
    """`status.phase` is Lost: its volume is gone."""
    class_name: str
    """"" for a claim of no class."""
    selected_node: str | None
    deleting: bool
    owner: str | None
    """The uid of its controller (a generic ephemeral volume's pod)."""
    uid: str
    request: Decimal
    """The storage it asks for, in bytes."""
    access_modes: frozenset[str]
    mode: str
    selector: Body | None
    """Its `spec.selector` of volumes' labels; None: any volume."""
    attributes_class: str
    """`spec.volumeAttributesClassName`."""
    version: int
    """Its resourceVersion (-1 when unknown): an older copy never replaces a newer one."""


@dataclass(frozen=True, slots=True)
class Volume:
    name: str
    node_terms: tuple[Body, ...] | None
    """Its required node affinity (nodeSelectorTerms, ORed); None: any node."""
    class_name: str
    capacity: Decimal
    """Its storage, in bytes."""
    access_modes: frozenset[str]
    mode: str
    labels: Mapping[str, str]
    claim_ref: tuple[str, str, str] | None
    """(namespace, name, uid) of the claim it is bound or promised to (uid "" when unsaid)."""
    available: bool
    """`status.phase` is Available: no claim has it."""
    attributes_class: str
    """`spec.volumeAttributesClassName`; a claim takes only a volume of its own."""
    deleting: bool
    version: int

    def made_for(self, claim: Claim) -> bool:
        """Whether its claimRef names `claim` (Kubernetes' IsVolumeBoundToClaim)."""
        ref = self.claim_ref
        return ref is not None and ref[:2] == claim.key and ref[2] in ("", claim.uid)

    def fits(self, claim: Claim) -> bool:
        """Whether it could serve `claim`, the node aside (FindMatchingVolume's checks)."""
        if self.deleting or self.capacity < claim.request or self.mode != claim.mode:
            return False
        if self.attributes_class != claim.attributes_class:
            return False
        if self.made_for(claim):
            return True
        return (
            self.claim_ref is None
            and self.available
            and self.class_name == claim.class_name
            and claim.access_modes <= self.access_modes
            and _selects(claim.selector, self.labels)
        )

    def reaches(self, node: NodeFacts) -> bool:
        """Whether `node` matches its node affinity, by the node's labels alone as Kubernetes
        matches a volume's (the node it builds has no name)."""
        if self.node_terms is None:
            return True
        unnamed = replace(node, name="")
        return any(term_matches(term, unnamed) for term in self.node_terms)


@dataclass(frozen=True, slots=True)
class StorageClass:
    name: str
    delayed: bool
    """`volumeBindingMode: WaitForFirstConsumer`."""
    provisioner: str
    topologies: tuple[Body, ...]
    """`allowedTopologies` (ORed); empty: any node."""

    def provisions_on(self, node: NodeFacts) -> bool:
        """Whether its provisioner may make a volume for `node`."""
        return self.provisioner not in ("", NO_PROVISIONER) and (
            not self.topologies or any(_topology_matches(t, node.labels) for t in self.topologies)
        )


@dataclass(frozen=True, slots=True)
class PodClaim:
    """A claim a pod's volumes name."""

    name: str
    ephemeral: bool
    """A generic ephemeral volume: the claim is the pod's own, made for it by a controller."""


@dataclass(frozen=True, slots=True)
class PodVolumes:
    """The claims of a pod, as its spec names them."""

    namespace: str
    pod: str
    uid: str
    claims: tuple[PodClaim, ...]


def pod_volumes(pod: Body) -> PodVolumes | None:
    """The claims `pod` uses; None when it uses none."""
    claims = []
    for volume in sequence(path(pod, "spec").get("volumes")):
        claim = text(mapping(volume.get("persistentVolumeClaim")).get("claimName"))
        if claim:
            claims.append(PodClaim(claim, ephemeral=False))
        elif isinstance(volume.get("ephemeral"), dict):
            name = text(path(pod, "metadata").get("name")) or ""
            claims.append(PodClaim(f"{name}-{text(volume.get('name')) or ''}", ephemeral=True))
    if not claims:
        return None
    meta = path(pod, "metadata")
    return PodVolumes(
        namespace=text(meta.get("namespace")) or "",
        pod=text(meta.get("name")) or "",
        uid=text(meta.get("uid")) or "",
        claims=tuple(dict.fromkeys(claims)),
    )


def claim_facts(body: Body) -> Claim:
    meta, spec = path(body, "metadata"), path(body, "spec")
    annotations = annotations_of(body)
    volume = text(spec.get("volumeName"))
    owner = next(
        (
            text(reference.get("uid"))
            for reference in sequence(meta.get("ownerReferences"))
            if reference.get("controller") is True
        ),
        None,
    )
    selector = spec.get("selector")
    return Claim(
        key=(text(meta.get("namespace")) or "", text(meta.get("name")) or ""),
        volume=volume if volume and BIND_COMPLETED in annotations else None,
        named_volume=volume or None,
        lost=path(body, "status").get("phase") == "Lost",
        class_name=_class_of(body),
        selected_node=annotations.get(SELECTED_NODE) or None,
        deleting=bool(meta.get("deletionTimestamp")),
        owner=owner,
        uid=text(meta.get("uid")) or "",
        request=_storage(path(spec, "resources", "requests").get("storage")),
        access_modes=_modes(spec),
        mode=text(spec.get("volumeMode")) or FILESYSTEM,
        selector=selector if isinstance(selector, dict) else None,
        attributes_class=text(spec.get("volumeAttributesClassName")) or "",
        version=_version(body),
    )


def volume_facts(body: Body) -> Volume:
    meta, spec = path(body, "metadata"), path(body, "spec")
    required = path(spec, "nodeAffinity").get("required")
    terms = (
        None if required is None else tuple(sequence(mapping(required).get("nodeSelectorTerms")))
    )
    ref = spec.get("claimRef")
    return Volume(
        name=text(meta.get("name")) or "",
        node_terms=terms,
        class_name=_class_of(body),
        capacity=_storage(mapping(spec.get("capacity")).get("storage")),
        access_modes=_modes(spec),
        mode=text(spec.get("volumeMode")) or FILESYSTEM,
        labels={k: v for k, v in mapping(meta.get("labels")).items() if isinstance(v, str)},
        claim_ref=None
        if not isinstance(ref, dict)
        else (
            text(ref.get("namespace")) or "",
            text(ref.get("name")) or "",
            text(ref.get("uid")) or "",
        ),
        available=path(body, "status").get("phase") == "Available",
        attributes_class=text(spec.get("volumeAttributesClassName")) or "",
        deleting=bool(meta.get("deletionTimestamp")),
        version=_version(body),
    )


def _version(body: Body) -> int:
    version = resource_version(body)
    return -1 if version is None else version


def _class_of(body: Body) -> str:
    """A claim's or volume's storage class: the beta annotation, else `storageClassName`
    (Kubernetes' GetPersistentVolumeClaimClass and GetPersistentVolumeClass); "" for none."""
    beta = annotations_of(body).get(BETA_STORAGE_CLASS)
    return beta if beta is not None else text(path(body, "spec").get("storageClassName")) or ""


def _storage(quantity: object) -> Decimal:
    """Bytes of storage; 0 for a quantity that cannot be read (the apiserver validates them)."""
    try:
        return parse_decimal(quantity if quantity is not None else 0, where="storage")
    except GpuShareError:
        return Decimal(0)


def _modes(spec: Body) -> frozenset[str]:
    modes = spec.get("accessModes")
    return (
        frozenset(m for m in modes if isinstance(m, str))
        if isinstance(modes, list)
        else frozenset()
    )


def _selects(selector: Body | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against `labels`; None selects all."""
    if selector is None:
        return True
    match = mapping(selector.get("matchLabels"))
    if any(labels.get(str(key)) != value for key, value in match.items()):
        return False
    return all(requirement_matches(e, labels) for e in sequence(selector.get("matchExpressions")))


def class_facts(body: Body) -> StorageClass:
    return StorageClass(
        name=text(path(body, "metadata").get("name")) or "",
        delayed=body.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER,
        provisioner=text(body.get("provisioner")) or "",
        topologies=tuple(sequence(body.get("allowedTopologies"))),
    )


def _topology_matches(term: Body, labels: Mapping[str, str]) -> bool:
    """A TopologySelectorTerm: every expression's key has one of its values on the node (an
    empty term matches no node)."""
    expressions = sequence(term.get("matchLabelExpressions"))
    if not expressions:
        return False
    for expression in expressions:
        values = expression.get("values")
        value = labels.get(text(expression.get("key")) or "")
        if not isinstance(values, list) or value not in values:
            return False
    return True

"""A pod's PersistentVolumeClaims against a node, as kube-scheduler's VolumeBinding plugin
judges them, for the claims gpushare binds: claims already bound, and claims whose
StorageClass waits for the first consumer (`WaitForFirstConsumer`) and provisions.

- A bound claim (`spec.volumeName`, bind completed) goes where its PersistentVolume's node
  affinity allows (a zonal disk, a local volume).
- An unbound claim of an `Immediate` class (or of none) is left to the PersistentVolume
  controller: the pod waits until it is bound, as kube-scheduler makes it wait.
- An unbound `WaitForFirstConsumer` claim is provisioned for the chosen node: the scheduler
  writes `volume.kubernetes.io/selected-node` on it, the provisioner makes a volume there, and
  the pod is bound once the claim is (`Binding.claims`). A claim already given a node goes to
  that node alone. The class's `allowedTopologies` must match the node.

Not done, and said on the pod rather than ignored: binding a `WaitForFirstConsumer` claim to a
pre-provisioned volume (a class without a provisioner, such as local volumes), which
kube-scheduler matches by size, access modes and node itself. (In a class with a provisioner,
kube-scheduler also prefers a matching pre-provisioned volume; here such a claim is always
provisioned.) A claim that names its volume before the binding is complete (pre-bound) is
left to the PersistentVolume controller, as kube-scheduler leaves it. Not checked: CSI storage
capacity, attach limits per node, ReadWriteOncePod conflicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpushare.model.bodies import Body, annotations_of, mapping, path, sequence, text
from gpushare.model.filters import NodeFacts, term_matches

ClaimKey = tuple[str, str]
"""(namespace, name) of a PersistentVolumeClaim."""

SELECTED_NODE = "volume.kubernetes.io/selected-node"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
"""Read before `spec.storageClassName`, as Kubernetes reads a claim's class."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"

# kube-scheduler's words (pkg/scheduler/framework/plugins/volumebinding).
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
NODE_CONFLICT = "node(s) had volume node affinity conflict"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
MISSING_VOLUME = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"


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
    version: int = -1
    """Its resourceVersion (-1 when unknown): an older copy never replaces a newer one."""


@dataclass(frozen=True, slots=True)
class Volume:
    name: str
    node_terms: tuple[Body, ...] | None
    """Its required node affinity (nodeSelectorTerms, ORed); None: any node."""

    def reaches(self, node: NodeFacts) -> bool:
        """Whether `node` matches its node affinity, by the node's labels alone as Kubernetes
        matches a volume's (a term's matchFields never match)."""
        if self.node_terms is None:
            return True
        unnamed = replace(node, name="")
        return any(
            not sequence(term.get("matchFields")) and term_matches(term, unnamed)
            for term in self.node_terms
        )


@dataclass(frozen=True, slots=True)
class StorageClass:
    name: str
    delayed: bool
    """`volumeBindingMode: WaitForFirstConsumer`."""
    provisioner: str
    topologies: tuple[Body, ...]
    """`allowedTopologies` (ORed); empty: any node."""


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
    version = text(meta.get("resourceVersion")) or ""
    beta_class = annotations.get(BETA_STORAGE_CLASS)
    return Claim(
        key=(text(meta.get("namespace")) or "", text(meta.get("name")) or ""),
        volume=volume if volume and BIND_COMPLETED in annotations else None,
        named_volume=volume or None,
        lost=path(body, "status").get("phase") == "Lost",
        class_name=beta_class
        if beta_class is not None
        else text(spec.get("storageClassName")) or "",
        selected_node=annotations.get(SELECTED_NODE) or None,
        deleting=bool(meta.get("deletionTimestamp")),
        owner=owner,
        version=int(version) if version.isdigit() else -1,
    )


def volume_facts(body: Body) -> Volume:
    required = path(body, "spec", "nodeAffinity").get("required")
    terms = (
        None if required is None else tuple(sequence(mapping(required).get("nodeSelectorTerms")))
    )
    return Volume(name=text(path(body, "metadata").get("name")) or "", node_terms=terms)


def class_facts(body: Body) -> StorageClass:
    return StorageClass(
        name=text(path(body, "metadata").get("name")) or "",
        delayed=body.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER,
        provisioner=text(body.get("provisioner")) or "",
        topologies=tuple(sequence(body.get("allowedTopologies"))),
    )


@dataclass(frozen=True, slots=True)
class ClaimNeeds:
    """A pod's claims resolved against the cluster: what each node must offer them."""

    bound: tuple[tuple[Claim, Volume | None], ...] = ()
    delayed: tuple[tuple[Claim, StorageClass], ...] = ()

    def reason(self, node: NodeFacts) -> str | None:
        """Why `node` cannot take the pod's volumes, or None."""
        for _, volume in self.bound:
            if volume is None:
                return MISSING_VOLUME
            if not volume.reaches(node):
                return NODE_CONFLICT
        for claim, storage in self.delayed:
            if claim.selected_node is not None and claim.selected_node != node.name:
                return BIND_CONFLICT
            if storage.topologies and not any(
                _topology_matches(term, node.labels) for term in storage.topologies
            ):
                return BIND_CONFLICT
        return None

    def binding(self, node: str) -> ClaimBinding | None:
        """What binding the pod to `node` asks of its claims first; None: nothing."""
        if not self.delayed:
            return None
        return ClaimBinding(
            node=node,
            select=tuple((c.key, c.version) for c, _ in self.delayed if c.selected_node is None),
            wait=tuple(c.key for c, _ in self.delayed),
        )


@dataclass(frozen=True, slots=True)
class ClaimBinding:
    """Before a pod is bound to `node`: the claims to give that node (`SELECTED_NODE`), and
    the claims to wait for until their provisioner has bound them."""

    node: str
    select: tuple[tuple[ClaimKey, int], ...]
    """The claims to give the node, each with the version it was decided on (the write's
    precondition: a claim given another node meanwhile is not overwritten)."""
    wait: tuple[ClaimKey, ...]


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


@dataclass(slots=True)
class VolumeBook:
    """The claims, volumes and classes of the cluster, as last seen. `listed`: whether the
    claims have been read at all (a reader that cannot see them checks nothing)."""

    claims: dict[ClaimKey, Claim] = field(default_factory=dict)
    volumes: dict[str, Volume] = field(default_factory=dict)
    classes: dict[str, StorageClass] = field(default_factory=dict)
    listed: bool = False

    def observe_claim(self, claim: Claim) -> bool:
        """Take a claim's state; whether anything a decision reads changed."""
        before = self.claims.get(claim.key)
        if before is not None and -1 < claim.version < before.version:
            return False  # an older copy than the one held
        self.claims[claim.key] = claim
        return before is None or _decides(before) != _decides(claim)

    def forget_claim(self, key: ClaimKey) -> bool:
        return self.claims.pop(key, None) is not None

    def observe_volume(self, volume: Volume) -> bool:
        before, self.volumes[volume.name] = self.volumes.get(volume.name), volume
        return before != volume

    def forget_volume(self, name: str) -> bool:
        return self.volumes.pop(name, None) is not None

    def observe_class(self, storage: StorageClass) -> bool:
        before, self.classes[storage.name] = self.classes.get(storage.name), storage
        return before != storage

    def forget_class(self, name: str) -> bool:
        return self.classes.pop(name, None) is not None

    def select(self, binding: ClaimBinding) -> None:
        """Take the claims `binding` gives its node as given, before the write lands (the
        next decision sees them so: a claim two pods share is given one node)."""
        for key, _ in binding.select:
            claim = self.claims.get(key)
            if claim is not None and claim.selected_node is None:
                self.claims[key] = replace(claim, selected_node=binding.node)

    def unselect(self, binding: ClaimBinding) -> None:
        """Undo `select` where nothing newer was seen of the claim since (the write failed,
        or never went out)."""
        for key, version in binding.select:
            claim = self.claims.get(key)
            if claim is not None and claim.version == version:
                self.claims[key] = replace(claim, selected_node=None)

    def needs(self, pod: PodVolumes) -> ClaimNeeds | str:
        """The pod's claims as they stand, or why the pod cannot be placed anywhere yet
        (kube-scheduler's PreFilter: a claim missing, being deleted, or waiting to be bound
        by its controller)."""
        bound: list[tuple[Claim, Volume | None]] = []
        delayed: list[tuple[Claim, StorageClass]] = []
        for wanted in pod.claims:
            claim = self.claims.get((pod.namespace, wanted.name))
            problem = _unusable(pod, wanted, claim)
            if problem is not None:
                return problem
            assert claim is not None  # `_unusable` says so otherwise
            if claim.volume is not None:
                bound.append((claim, self.volumes.get(claim.volume)))
                continue
            storage = self.classes.get(claim.class_name) if claim.class_name else None
            # A pre-bound claim (its volume named, the binding not complete) is the PV
            # controller's to finish, as an Immediate one is (kube-scheduler's rule).
            if storage is None or not storage.delayed or claim.named_volume is not None:
                return UNBOUND_IMMEDIATE
            if storage.provisioner == NO_PROVISIONER:
                return (
                    f'persistentvolumeclaim "{wanted.name}" waits for a pre-provisioned volume '
                    f'(StorageClass "{storage.name}" has no provisioner), and the gpushare '
                    "scheduler binds no claim to one: bind the claim first (its spec.volumeName) "
                    "or give the class a provisioner"
                )
            delayed.append((claim, storage))
        return ClaimNeeds(bound=tuple(bound), delayed=tuple(delayed))

    def binding_state(self, binding: ClaimBinding, node: NodeFacts | None) -> str | None:
        """Whether the claims a bind waits for are ready: None once all are bound to volumes
        that reach `node` (the facts of `binding.node`, None when it is gone); "" while any is
        still being provisioned; else why the bind cannot go on (the provisioner gave a claim
        back, the claim went away, the volume made cannot reach the node)."""
        if node is None:
            return f"node {binding.node} was deleted"
        waiting = False
        for key in binding.wait:
            claim = self.claims.get(key)
            name = f"{key[0]}/{key[1]}"
            if claim is None or claim.deleting:
                return f"persistentvolumeclaim {name} was deleted"
            if claim.volume is None:
                if claim.selected_node != binding.node:
                    return (
                        f"persistentvolumeclaim {name} was given back by its provisioner "
                        f"(it could not provision a volume on node {binding.node})"
                    )
                waiting = True
                continue
            volume = self.volumes.get(claim.volume)
            if volume is None:
                waiting = True  # the volume's own event is yet to come
                continue
            if not volume.reaches(node):
                return (
                    f"persistentvolume {volume.name}, provisioned for persistentvolumeclaim "
                    f"{name}, cannot be reached from node {binding.node} (its node affinity)"
                )
        return "" if waiting else None


def _unusable(pod: PodVolumes, wanted: PodClaim, claim: Claim | None) -> str | None:
    """Why the claim keeps the pod off every node whatever its state of binding, or None."""
    if claim is None:
        if wanted.ephemeral:
            return (
                "waiting for ephemeral volume controller to create the persistentvolumeclaim "
                f'"{wanted.name}"'
            )
        return f'persistentvolumeclaim "{wanted.name}" not found'
    if claim.deleting:
        return f'persistentvolumeclaim "{wanted.name}" is being deleted'
    if wanted.ephemeral and claim.owner != pod.uid:
        return (
            f"PVC {pod.namespace}/{wanted.name} was not created for pod "
            f"{pod.namespace}/{pod.pod} (pod is not owner)"
        )
    if claim.lost:
        return (
            f'persistentvolumeclaim "{wanted.name}" bound to non-existent persistentvolume '
            f'"{claim.named_volume or ""}"'
        )
    return None


def _decides(claim: Claim) -> Claim:
    """What a decision reads of the claim: all but its version."""
    return replace(claim, version=-1)

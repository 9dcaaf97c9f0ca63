"""A pod's PersistentVolumeClaims against a node, as kube-scheduler's VolumeBinding plugin
judges them, for the claims gpushare binds: claims already bound, and claims whose
StorageClass waits for the first consumer (`WaitForFirstConsumer`), whether a volume is
pre-provisioned or provisioned.

- A bound claim (`spec.volumeName`, bind completed) goes where its PersistentVolume's node
  affinity allows (a zonal disk, a local volume).
- An unbound claim of an `Immediate` class (or of none) is left to the PersistentVolume
  controller: the pod waits until it is bound, as kube-scheduler makes it wait.
- An unbound `WaitForFirstConsumer` claim takes, on the chosen node, the smallest available
  pre-provisioned volume that fits it (its class, size, access modes, volume mode, selector,
  node affinity; a volume made for it, its claimRef naming it, alone): the scheduler writes
  the claim on the volume (`claimRef`), and the PersistentVolume controller binds the two.
  Without one there, a class with a provisioner provisions for the node: the scheduler writes
  `volume.kubernetes.io/selected-node` on the claim and the provisioner makes a volume there.
  Either way the pod is bound once the claim is (`ClaimBinding`). A claim already given a node
  goes to that node alone. The class's `allowedTopologies` must match the node.

A claim that names its volume before the binding is complete (pre-bound) is left to the
PersistentVolume controller, as kube-scheduler leaves it. Not checked: CSI storage capacity,
attach limits per node, ReadWriteOncePod conflicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpushare.model.filters import NodeFacts
from gpushare.model.volumes import (
    Claim,
    ClaimKey,
    PodClaim,
    PodVolumes,
    StorageClass,
    Volume,
)

# kube-scheduler's words (pkg/scheduler/framework/plugins/volumebinding).
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
NODE_CONFLICT = "node(s) had volume node affinity conflict"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
MISSING_VOLUME = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"


@dataclass(frozen=True, slots=True)
class Delayed:
    """An unbound claim of a `WaitForFirstConsumer` class, and the pre-provisioned volumes it
    may take (the node aside): the one made for it alone, else the available ones, smallest
    first."""

    claim: Claim
    storage: StorageClass
    volumes: tuple[Volume, ...]


@dataclass(frozen=True, slots=True)
class VolumeBind:
    """A pre-provisioned volume given to a claim: its claimRef written, at `version`."""

    volume: str
    version: int
    claim: ClaimKey
    claim_uid: str
    promised: bool
    """Its claimRef named the claim already: nothing to write."""


@dataclass(frozen=True, slots=True)
class ClaimBinding:
    """Before a pod is bound to `node`: the volumes to give its claims (`bind`), the claims to
    give that node for their provisioner (`SELECTED_NODE`), and the claims to wait for until
    they are bound."""

    node: str
    select: tuple[tuple[ClaimKey, int], ...]
    """The claims to give the node, each with the version it was decided on (the write's
    precondition: a claim given another node meanwhile is not overwritten)."""
    wait: tuple[ClaimKey, ...]
    bind: tuple[VolumeBind, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimNeeds:
    """A pod's claims resolved against the cluster: what each node must offer them."""

    bound: tuple[tuple[Claim, Volume | None], ...]
    delayed: tuple[Delayed, ...]

    def reason(self, node: NodeFacts) -> str | None:
        """Why `node` cannot take the pod's volumes, or None."""
        for _, volume in self.bound:
            if volume is None:
                return MISSING_VOLUME
            if not volume.reaches(node):
                return NODE_CONFLICT
        if self.delayed and self.binding(node) is None:
            return BIND_CONFLICT
        return None

    def binding(self, node: NodeFacts) -> ClaimBinding | None:
        """What binding the pod to `node` asks of its claims first (kube-scheduler's
        FindPodVolumes); None where they cannot be bound there, or ask nothing."""
        if not self.delayed:
            return None
        select: list[tuple[ClaimKey, int]] = []
        binds: list[VolumeBind] = []
        taken: set[str] = set()
        # The claims asking least first, as kube-scheduler matches them (byPVCSize).
        for delayed in sorted(self.delayed, key=lambda d: d.claim.request):
            claim = delayed.claim
            if claim.selected_node is None:
                volume = next(
                    (v for v in delayed.volumes if v.name not in taken and v.reaches(node)), None
                )
                if volume is not None:
                    taken.add(volume.name)
                    binds.append(
                        VolumeBind(
                            volume.name,
                            volume.version,
                            claim.key,
                            claim.uid,
                            volume.made_for(claim),
                        )
                    )
                    continue
                select.append((claim.key, claim.version))
            elif claim.selected_node != node.name:
                return None
            if not delayed.storage.provisions_on(node):
                return None
        return ClaimBinding(
            node=node.name,
            select=tuple(select),
            wait=tuple(d.claim.key for d in self.delayed),
            bind=tuple(binds),
        )


@dataclass(slots=True)
class VolumeBook:
    """The claims, volumes and classes of the cluster, as last seen. `listed`: whether the
    claims have been read at all (a reader that cannot see them checks nothing)."""

    claims: dict[ClaimKey, Claim] = field(default_factory=dict)
    volumes: dict[str, Volume] = field(default_factory=dict)
    classes: dict[str, StorageClass] = field(default_factory=dict)
    listed: bool = False
    _by_class: dict[str, dict[str, Volume]] = field(default_factory=dict)
    """The volumes by their class: what a claim may take is looked for among its class's."""
    _made_for: dict[ClaimKey, str] = field(default_factory=dict)
    """The volume whose claimRef names each claim."""

    def observe_claim(self, claim: Claim) -> bool:
        """Take a claim's state; whether anything a decision reads changed."""
        before = self.claims.get(claim.key)
        if not _newer(claim.version, before):
            return False
        self.claims[claim.key] = claim
        return before is None or _decides(before) != _decides(claim)

    def forget_claim(self, key: ClaimKey) -> bool:
        return self.claims.pop(key, None) is not None

    def observe_volume(self, volume: Volume) -> bool:
        before = self.volumes.get(volume.name)
        if not _newer(volume.version, before):
            return False
        self._put_volume(volume)
        return before is None or _decides(before) != _decides(volume)

    def forget_volume(self, name: str) -> bool:
        return self._drop_volume(name) is not None

    def observe_class(self, storage: StorageClass) -> bool:
        before, self.classes[storage.name] = self.classes.get(storage.name), storage
        return before != storage

    def forget_class(self, name: str) -> bool:
        return self.classes.pop(name, None) is not None

    def select(self, binding: ClaimBinding) -> None:
        """Take what `binding` writes as written, before the writes land (the next decision
        sees it so: a claim two pods share is given one node, a volume goes to one claim)."""
        for key, _ in binding.select:
            claim = self.claims.get(key)
            if claim is not None and claim.selected_node is None:
                self.claims[key] = replace(claim, selected_node=binding.node)
        for bind in binding.bind:
            volume = self.volumes.get(bind.volume)
            if volume is not None and not bind.promised:
                ref = (*bind.claim, bind.claim_uid)
                self._put_volume(replace(volume, claim_ref=ref, available=False))

    def unselect(self, binding: ClaimBinding) -> None:
        """Undo `select` where nothing newer was seen since (the writes failed, or never went
        out)."""
        for key, version in binding.select:
            claim = self.claims.get(key)
            if claim is not None and claim.version == version:
                self.claims[key] = replace(claim, selected_node=None)
        for bind in binding.bind:
            volume = self.volumes.get(bind.volume)
            if volume is not None and volume.version == bind.version and not bind.promised:
                self._put_volume(replace(volume, claim_ref=None, available=True))

    def needs(self, pod: PodVolumes) -> ClaimNeeds | str:
        """The pod's claims as they stand, or why the pod cannot be placed anywhere yet
        (kube-scheduler's PreFilter: a claim missing, being deleted, or waiting to be bound
        by its controller)."""
        bound: list[tuple[Claim, Volume | None]] = []
        delayed: list[Delayed] = []
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
            delayed.append(Delayed(claim, storage, self._volumes_for(claim)))
        return ClaimNeeds(bound=tuple(bound), delayed=tuple(delayed))

    def _volumes_for(self, claim: Claim) -> tuple[Volume, ...]:
        """The pre-provisioned volumes `claim` may take, the node aside: the one made for it
        alone, else those that fit it, smallest first (FindMatchingVolume)."""
        if not claim.uid:
            return ()  # a claimRef needs it: the PV controller never lets go of one without
        made = self.volumes.get(self._made_for.get(claim.key, ""))
        if made is not None and made.made_for(claim) and made.fits(claim):
            return (made,)
        fitting = [v for v in self._by_class.get(claim.class_name, {}).values() if v.fits(claim)]
        return tuple(sorted(fitting, key=lambda v: (v.capacity, v.name)))

    def binding_state(self, binding: ClaimBinding, node: NodeFacts | None) -> str | None:
        """Whether the claims a bind waits for are ready: None once all are bound to volumes
        that reach `node` (the facts of `binding.node`, None when it is gone); "" while any is
        still being bound; else why the bind cannot go on (the provisioner gave a claim back,
        a volume went to another claim, the claim went away, the volume cannot reach the
        node)."""
        if node is None:
            return f"node {binding.node} was deleted"
        given = {bind.claim: bind for bind in binding.bind}
        waiting = False
        for key in binding.wait:
            claim = self.claims.get(key)
            name = f"{key[0]}/{key[1]}"
            if claim is None or claim.deleting:
                return f"persistentvolumeclaim {name} was deleted"
            if claim.volume is None:
                problem = self._unbound_problem(claim, given.get(key), binding.node)
                if problem:
                    return problem
                waiting = True
                continue
            volume = self.volumes.get(claim.volume)
            if volume is None:
                waiting = True  # the volume's own event is yet to come
                continue
            if not volume.reaches(node):
                return (
                    f"persistentvolume {volume.name}, bound to persistentvolumeclaim {name}, "
                    f"cannot be reached from node {binding.node} (its node affinity)"
                )
        return "" if waiting else None

    def _unbound_problem(self, claim: Claim, bind: VolumeBind | None, node: str) -> str | None:
        name = f"{claim.key[0]}/{claim.key[1]}"
        if bind is None:
            if claim.selected_node != node:
                return (
                    f"persistentvolumeclaim {name} was given back by its provisioner (it "
                    f"could not provision a volume on node {node})"
                )
            return None
        volume = self.volumes.get(bind.volume)
        reset = volume is not None and volume.version > bind.version and not bind.promised
        if reset and volume is not None and (volume.claim_ref is None or not volume.claim_ref[2]):
            return (
                f"persistentvolume {bind.volume}, given to persistentvolumeclaim {name}, was "
                "given back (its claimRef was reset)"
            )
        if volume is None or volume.deleting:
            return (
                f"persistentvolume {bind.volume}, given to persistentvolumeclaim {name}, was "
                "deleted"
            )
        if volume.claim_ref is not None and not volume.made_for(claim):
            return (
                f"persistentvolume {bind.volume}, given to persistentvolumeclaim {name}, was "
                "bound to another claim"
            )
        return None

    def _put_volume(self, volume: Volume) -> None:
        self._drop_volume(volume.name)
        self.volumes[volume.name] = volume
        self._by_class.setdefault(volume.class_name, {})[volume.name] = volume
        if volume.claim_ref is not None:
            self._made_for[volume.claim_ref[:2]] = volume.name

    def _drop_volume(self, name: str) -> Volume | None:
        old = self.volumes.pop(name, None)
        if old is not None:
            self._by_class.get(old.class_name, {}).pop(name, None)
            if old.claim_ref is not None and self._made_for.get(old.claim_ref[:2]) == name:
                del self._made_for[old.claim_ref[:2]]
        return old


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


_Copy = TypeVar("_Copy", Claim, Volume)


def _newer(version: int, held: Claim | Volume | None) -> bool:
    """Whether a copy at `version` is to replace `held`: not when it is no newer (a relist's
    copy would undo what was decided on the one held)."""
    return held is None or not -1 < version <= held.version


def _decides(copy: _Copy) -> _Copy:
    """What a decision reads of a claim or volume: all but its version."""
    return replace(copy, version=-1)

"""A pod's GPU request, read from a pod manifest the way kube-scheduler reads resources.

Only `limits` count (extended resources cannot be overcommitted, so Kubernetes requires
limits and defaults requests to them). The pod total follows kube-scheduler's rule
(k8s.io/component-helpers resource.PodRequests): app containers and restartable init
containers (sidecars) run together; a plain init container runs alone, alongside only the
sidecars started before it; the pod needs the larger of the two. Per-container amounts are
kept because the device plugin serves each container by its own device count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gpushare.model import contract
from gpushare.model.bodies import Body, describe, mapping, path, sequence, text
from gpushare.model.errors import InvalidRequest
from gpushare.model.quantity import parse_quantity

Signature = tuple[str, tuple[tuple[bool, int], ...]]
"""A request's GPU kind and per-container (init, amount): see `PodRequest.signature`."""


class GpuKind(StrEnum):
    """What a pod asks for: a share of one card's memory, or whole cards."""

    MEMORY = contract.GPU_MEMORY
    NUMBER = contract.GPU_NUMBER


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerRequest:
    """One container's GPU limit: memory units or whole cards, per the pod's kind."""

    name: str
    init: bool
    """An init container (plain or sidecar)."""
    sidecar: bool
    """A restartable init container (`restartPolicy: Always`), running beside the app."""
    amount: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PodRequest:
    """The GPU request of a pod; `kind` is None for a pod that asks for no GPU."""

    kind: GpuKind | None
    total: int
    """Memory units needed on the one card (MEMORY), or the number of whole cards (NUMBER)."""
    containers: tuple[ContainerRequest, ...]
    """The containers whose limit asks for the pod's kind, in spec order."""

    @property
    def signature(self) -> Signature:
        """Pods with equal signatures are interchangeable to the device plugin's Allocate."""
        kind = self.kind.value if self.kind else ""
        return kind, tuple((c.init, c.amount) for c in self.containers)


NO_GPU = PodRequest(kind=None, total=0, containers=())


def pod_total(app: Iterable[int], init: Iterable[tuple[int, bool]]) -> int:
    """kube-scheduler's pod total from app amounts and (amount, is_sidecar) init containers.

    Init containers are taken in spec order: each sidecar adds to the running set; a plain
    init container needs its own amount plus the sidecars already started.
    """
    running = sum(app)
    sidecars = 0
    peak_init = 0
    for amount, sidecar in init:
        if sidecar:
            running += amount
            sidecars += amount
            peak_init = max(peak_init, sidecars)
        else:
            peak_init = max(peak_init, amount + sidecars)
    return max(running, peak_init)


def gpu_request(pod: Body) -> PodRequest:
    """The GPU request of `pod`, or InvalidRequest/InvalidQuantity saying what to fix."""
    spec = path(pod, "spec")
    who = describe(pod, "pod")
    entries: list[tuple[ContainerRequest, GpuKind]] = []
    for init, field in ((False, "containers"), (True, "initContainers")):
        for container in sequence(spec.get(field)):
            entries.extend(_container_requests(container, init=init, who=who))
    kinds = {kind for _, kind in entries}
    if len(kinds) > 1:
        raise InvalidRequest(
            f"{who} asks for both {contract.GPU_MEMORY} and {contract.GPU_NUMBER}; a pod gets "
            f"either a share of one card or whole cards: remove one of the two limits"
        )
    if not kinds:
        return NO_GPU
    kind = kinds.pop()
    # Spec order within each group: app containers first, then init containers.
    containers = tuple(request for request, _ in entries)
    total = pod_total(
        (c.amount for c in containers if not c.init),
        ((c.amount, c.sidecar) for c in containers if c.init),
    )
    return PodRequest(kind=kind, total=total, containers=containers)


def _container_requests(
    container: Body, *, init: bool, who: str
) -> list[tuple[ContainerRequest, GpuKind]]:
    name = text(container.get("name")) or "<unnamed>"
    owner = f"{who} {'init container' if init else 'container'} {name}"
    resources = mapping(container.get("resources"))
    limits = mapping(resources.get("limits"))
    requests = mapping(resources.get("requests"))
    sidecar = init and container.get("restartPolicy") == "Always"
    found: list[tuple[ContainerRequest, GpuKind]] = []
    for kind in GpuKind:
        if kind.value not in limits:
            if kind.value in requests:
                raise InvalidRequest(
                    f"{owner} sets {kind.value} under requests only; GPU resources are read "
                    f"from limits: move it to resources.limits"
                )
            continue
        amount = parse_quantity(limits[kind.value], resource=kind.value, owner=owner)
        if amount > 0:
            request = ContainerRequest(name=name, init=init, sidecar=sidecar, amount=amount)
            found.append((request, kind))
    return found
